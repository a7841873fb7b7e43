#!/usr/bin/env bash
# edgetrain-emulate where network namespaces are unavailable: an `ip` earlier on PATH fails
# `ip netns add` as an unprivileged user's would. The launcher must say so, fall back to
# loopback (every worker on its own impairer port on 127.0.0.1), create no namespace, and
# the workers must still train through the impairer: test accuracy reaches FLOOR, and every
# link relayed traffic. Before that, bad options (on the command line or in a --config
# file) must fail with a clear message, an --out directory holding anything but an earlier
# run must be left alone, and a run whose workers all exit (its settings from a --config
# file) must stop at once with status 4.
# usage: emulate_loopback_fallback.sh BUILD_DIR [FLOOR]
build_dir="$1"; floor="${2:-0.75}"
emulate="$(dirname "$0")/../../emulation/edgetrain-emulate"
source "$(dirname "$0")/../integration/process_test_lib.sh"
require_mnist

real_ip=$(command -v ip || true)
mkdir -p "$work/bin"
cat >"$work/bin/ip" <<EOS
#!/bin/sh
if [ "\$1" = netns ] && [ "\$2" = add ]; then
  echo "mount --make-shared /run/netns failed: Operation not permitted" >&2
  exit 1
fi
touch "$work/ip-called-otherwise"
exec ${real_ip:-false} "\$@"
EOS
chmod +x "$work/bin/ip"

# Bad input first: a clear error, exit 1, and nothing lost.
mkdir -p "$work/precious" && echo keep >"$work/precious/file"
if "$emulate" --build-dir "$build_dir" --out "$work/precious" --workers 2 >"$work/refused.log" 2>&1; then
  fail "an --out directory holding other files was accepted"
fi
grep -q "refusing to empty --out" "$work/refused.log" && [ -f "$work/precious/file" ] ||
  fail "no clear refusal, or the directory was emptied: $(cat "$work/refused.log")"
for bad in "--workers 0" "--link delay=fast" "--fail kill-worker:9@5" "--no-such-option"; do
  # shellcheck disable=SC2086
  if "$emulate" --build-dir "$build_dir" --out "$work/bad" --workers 2 $bad >"$work/bad.log" 2>&1; then
    fail "'$bad' was accepted"
  fi
  grep -q "^edgetrain-emulate: " "$work/bad.log" || fail "'$bad' gave no clear error: $(cat "$work/bad.log")"
done

# The settings also come from a TOML file (--config, keys named like the flags): a
# misspelt key is refused with its line and the likely key.
printf 'workers = 2\nwrokers = 3\n' >"$work/misspelt.toml"
if "$emulate" --build-dir "$build_dir" --out "$work/bad" --config "$work/misspelt.toml" >"$work/bad.log" 2>&1; then
  fail "a misspelt key in --config was accepted"
fi
grep -q "^edgetrain-emulate: .*misspelt.toml:2: unknown key 'wrokers' (did you mean 'workers'?)" "$work/bad.log" ||
  fail "no clear error for a misspelt key: $(cat "$work/bad.log")"

# A run whose every worker gives up (here: a learning rate that makes the model diverge at
# once) stops then, not at --duration, with exit status 4 and its summary written. Its
# settings come from a file, one of them overridden by a flag.
# The server refuses updates that leave a parameter beyond its bound (default 1e6), which
# lr 1e30 would: with the bound at the largest float the model still blows up in the
# workers' arithmetic (never to a non-finite value on the server), and they give up.
printf 'workers = 2\nmodel = "mlp"\ndata = "mnist-small"\nlr = 1e30\nmax_parameter_magnitude = 3.4e38\nduration = 30\nquiet = true\n' >"$work/diverge.toml"
status=0
started=$SECONDS
"$emulate" --build-dir "$build_dir" --out "$work/diverged" --config "$work/diverge.toml" --duration 120 \
  >"$work/diverged.log" 2>&1 || status=$?
[ "$status" -eq 4 ] || fail "a run whose workers all exited gave status $status, not 4: $(tail -n 5 "$work/diverged.log")"
(( SECONDS - started < 60 )) || fail "a run whose workers all exited went on for $((SECONDS - started)) s"
[ "$(json_get "$work/diverged/outcome.json" stop)" = workers-gone ] ||
  fail "the outcome does not say why the run stopped: $(cat "$work/diverged/outcome.json")"
[ -s "$work/diverged/summary.md" ] || fail "no summary of the diverged run"
[ "$(tail -n +2 "$work/diverged/plan.csv" | wc -l)" -eq 2 ] || fail "--config's workers = 2 was not applied"

status=0
PATH="$work/bin:$PATH" "$emulate" --build-dir "$build_dir" --out "$work/run" --workers 2 --model mlp --data mnist-small --pull-every 2 \
  --link delay=2,bandwidth=20000 --impaired 1 --duration 80 --target-accuracy "$floor" --eval-interval 1 --quiet \
  >"$work/emulate.log" 2>&1 || status=$?
watched_logs+=("$work/emulate.log" "$work/run/logs/server-1.log" "$work/run/logs/worker-0.log")
[ "$status" -eq 0 ] || fail "edgetrain-emulate exited with status $status"
grep -q "network namespaces unavailable ('ip netns add' failed: mount --make-shared" "$work/emulate.log" ||
  fail "no message about the fallback"
[ "$(json_get "$work/run/outcome.json" network)" = loopback ] || fail "the outcome does not say loopback"
[ ! -e "$work/ip-called-otherwise" ] || fail "the loopback fallback still ran ip for namespaces or links"
awk -F, 'NR > 1 && $2 !~ /^127\.0\.0\.1:[1-9]/ { bad = 1 } NR > 1 && $10 == 0 { bad = 1 } END { exit bad }' "$work/run/links.csv" ||
  fail "links not on loopback or without traffic: $(cat "$work/run/links.csv")"
[ "$(json_get "$work/run/outcome.json" stop)" = target ] &&
  json_compare "$(json_get "$work/run/outcome.json" target_reached.accuracy)" -ge "$floor" ||
  fail "test accuracy never reached $floor"
echo "namespaces unavailable: fell back to loopback and trained past $floor through the impairer"
