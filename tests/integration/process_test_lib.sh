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

# expect_emulated_restarts_lost_nothing OUTCOME WHAT: an edgetrain-emulate run's outcome.json
# holds exactly one restart check (a server's or a shard's: WHAT names it in the message),
# which lost no acknowledged update, recovered at least the highest version acknowledged
# before the kill, and came after updates had been applied; prints the recovered version.
expect_emulated_restarts_lost_nothing() {
  local outcome="$1" what="$2" recovered
  [ "$(json_get "$outcome" server_restarts | wc -l)" -eq 1 ] && [ "$(json_get "$outcome" server_restarts.0.lost)" = false ] &&
    [ "$(json_get "$outcome" lost_acknowledged_updates)" = false ] ||
    fail "no successful restart check after the SIGKILL of $what"
  recovered=$(json_get "$outcome" server_restarts.0.recovered_version)
  [ "$recovered" -ge "$(json_get "$outcome" server_restarts.0.highest_acknowledged)" ] || fail "the restart check is wrong"
  [ "$recovered" -gt 0 ] || fail "$what was killed before any update was applied"
  echo "$recovered"
}
