# Sourced by the process-level tests (edgetrain-server and edgetrain-worker as separate
# programs on loopback): common/processes.sh (start, wait on port and stats files, read
# JSON, logs printed on failure), plus what only tests want: strict bash, a private work
# directory, every started program killed when the test exits however it exits, and the
# skip when MNIST is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../common/processes.sh"

work=$(mktemp -d)
trap 'stop_started_programs; rm -rf "$work"' EXIT

# require_mnist: without the CI-sized MNIST subset (data set mnist-small, which the
# end-to-end tests train on), skips the test (exit 77) on a developer's machine and
# fails it under CI (CI set), where set-up always provides the data; the C++ tests follow
# the same rule (EDGETRAIN_REQUIRE_DATA in tests/support/test_data.h).
mnist_dir="${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist-small"
require_mnist() {
  if ! ls "$mnist_dir"/train-images-idx3-ubyte* >/dev/null 2>&1; then
    [ -z "${CI:-}" ] || fail "no MNIST in $mnist_dir under CI (toolchains/setup-deps.sh converts it)"
    echo "SKIP: no MNIST in $mnist_dir (toolchains/setup-deps.sh converts it)"
    exit 77
  fi
}
