#!/usr/bin/env bash
# The programs' settings tables (common/settings.h) seen from the command line, with no
# network and no data: --version on every program (one version string); an unknown TOML
# key refused with its name, line and a "did you mean"; a wrong type refused with key and
# line; a value out of range refused; a flag beating the file.
# usage: program_settings.sh SERVER WORKER SIM IMPAIRER SMOKE REPORT EMULATE LOADGEN
set -u
server="$1"; worker="$2"; sim="$3"; impairer="$4"; smoke="$5"; report="$6"; emulate="$7"; loadgen="$8"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect_refused DESCRIPTION PATTERN PROGRAM ARGS...: PROGRAM fails and says PATTERN.
expect_refused() {
  local what="$1" pattern="$2"; shift 2
  local out
  if out=$("$@" 2>&1); then fail "$what: accepted"; fi
  grep -qF -- "$pattern" <<<"$out" || fail "$what: no '$pattern' in: $out"
  echo "ok: $what: $(grep -m1 -F -- "$pattern" <<<"$out")"
}

version=""
for program in "$server" "$worker" "$sim" "$impairer" "$smoke" "$report" "$emulate" "$loadgen"; do
  out=$("$program" --version) || fail "$program --version failed"
  [[ "$out" =~ ^edgetrain-[a-z-]+\ ([0-9]+\.[0-9]+\.[0-9]+)$ ]] || fail "$program --version printed '$out'"
  [ -z "$version" ] || [ "${BASH_REMATCH[1]}" = "$version" ] || fail "$program says ${BASH_REMATCH[1]}, others $version"
  version="${BASH_REMATCH[1]}"
  echo "ok: $out"
done

# A misspelt key, two lines down: refused with its line and the key it resembles.
printf 'model = "mlp"\n\nidentiy = "pi-01"\n' >"$work/worker.toml"
expect_refused "worker: unknown key" "worker.toml:3: unknown key 'identiy' (did you mean 'identity'?)" \
  "$worker" --config "$work/worker.toml"
printf 'port = 0\neval_interval_seconds = 5\n' >"$work/server.toml"
expect_refused "server: renamed key" "server.toml:2: unknown key 'eval_interval_seconds' (did you mean 'eval_interval'?)" \
  "$server" --config "$work/server.toml" --state-dir "$work/state"
printf 'workers = 4\nmethod = "asgd"\ntarget = 0.9\n' >"$work/sim.toml"
expect_refused "sim: unknown key" "sim.toml:2: unknown key 'method'" "$sim" --config "$work/sim.toml"
printf 'workers = 4\ntarget_acuracy = 0.9\n' >"$work/sim-typo.toml"
expect_refused "sim: misspelt key" "sim-typo.toml:2: unknown key 'target_acuracy' (did you mean 'target_accuracy'?)" \
  "$sim" --config "$work/sim-typo.toml"
[ ! -e "$work/state" ] || fail "the server made its state directory despite a bad config"

# Wrong types, with key and line.
printf 'seed = 2\nworkers = "4"\n' >"$work/types.toml"
expect_refused "worker: wrong type" "types.toml:2: 'workers' must be a non-negative integer, not a string" \
  "$worker" --config "$work/types.toml"
expect_refused "sim: wrong type" "types.toml:2: 'workers' must be an integer, not a string" "$sim" --config "$work/types.toml"
printf 'lr = "fast"\n' >"$work/server-type.toml"
expect_refused "server: wrong type" "server-type.toml:1: 'lr' must be a number, not a string" \
  "$server" --config "$work/server-type.toml" --state-dir "$work/state"
printf '[[link]]\nname = "w0"\nlisten = "127.0.0.1:0"\nupstream = "127.0.0.1:5684"\ndelay = 5\n' >"$work/links.toml"
expect_refused "impairer: unknown link key" "links.toml:5: link w0: unknown key 'delay' (did you mean 'delay_ms'?)" \
  "$impairer" --links "$work/links.toml"

# Syntax errors carry line and column.
printf 'batch = 10\nserver = "coaps://unterminated\n' >"$work/syntax.toml"
expect_refused "worker: TOML syntax error" "syntax.toml:2:" "$worker" --config "$work/syntax.toml"

# Ranges and choices, from a flag or the file.
expect_refused "worker: batch out of range (flag)" "--batch: batch must be in 1..4096, not 0" "$worker" --batch 0
printf 'compressor = "top-k"\n' >"$work/choice.toml"
expect_refused "worker: compressor not a choice (file)" "compressor must be one of adacomp, none, not 'top-k'" \
  "$worker" --config "$work/choice.toml"
expect_refused "sim: compressor not a choice" "compressor must be one of none, adacomp, both, not 'asgd'" \
  "$sim" --compressor asgd

# A flag beats the file: the file's bad batch is never used when --batch is given, and the
# worker gets past every settings check (to the missing PSK identity).
printf 'batch = 0\n' >"$work/bad-batch.toml"
expect_refused "worker: the file's value when no flag is given" "bad-batch.toml:1 (batch): batch must be in 1..4096" \
  "$worker" --config "$work/bad-batch.toml"
expect_refused "worker: the flag's value over the file's" "no PSK identity" \
  "$worker" --config "$work/bad-batch.toml" --batch 10
# The file's values are used: an identity from the file gets the worker to the next check.
printf 'identity = "pi-01"\nkey_hex = "zz"\n' >"$work/identity.toml"
expect_refused "worker: identity and key_hex from the file" "hex" "$worker" --config "$work/identity.toml"
echo "settings: every program agrees"
