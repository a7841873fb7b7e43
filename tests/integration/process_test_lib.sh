# Sourced by the process-level tests (edgetrain-server and edgetrain-worker as separate
# programs on loopback): common/processes.sh (start, wait on port and stats files, read
# JSON, logs printed on failure), plus what only tests want: strict bash, a private work
# directory, every started program killed when the test exits however it exits, and the
# skip when MNIST is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../common/processes.sh"

work=$(mktemp -d)
trap 'stop_started_programs; rm -rf "$work"' EXIT

mnist_dir="${EDGETRAIN_DEPS:-/var/cache/edgetrain}/mnist"
require_mnist() {
  if ! ls "$mnist_dir"/train-images-idx3-ubyte* >/dev/null 2>&1; then
    echo "SKIP: no MNIST in $mnist_dir (toolchains/setup-deps.sh converts it)"
    exit 77
  fi
}
