#!/usr/bin/env bash
# edgetrain-worker refuses two value encodings at once, before it touches the network or
# the data: --fp16 with --sign-scale, and fp16 with sign_scale through --config (alone or
# mixed with a flag). One of them alone gets past that check (and then stops at the missing
# PSK identity, which shows the option itself was accepted).
# usage: worker_value_encoding_flags.sh WORKER
set -u
worker="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

expect_refused() {  # DESCRIPTION PATTERN ARGS...
  local what="$1" pattern="$2"; shift 2
  local out
  if out=$("$worker" "$@" 2>&1); then fail "$what: accepted"; fi
  grep -q -- "$pattern" <<<"$out" || fail "$what: no '$pattern' in: $out"
  echo "ok: $what refused: $(grep -m1 -- "$pattern" <<<"$out")"
}

expect_refused "--fp16 --sign-scale" "exclude each other" --fp16 --sign-scale
printf 'fp16 = true\nsign_scale = true\n' >"$work/both.toml"
expect_refused "fp16 and sign_scale in --config" "exclude each other" --config "$work/both.toml"
printf 'fp16 = true\n' >"$work/fp16.toml"
expect_refused "fp16 in --config with --sign-scale" "exclude each other" --config "$work/fp16.toml" --sign-scale
out=$("$worker" --sign-scale --error-feedback 2>&1) && fail "--sign-scale without an identity: accepted"
grep -q "no PSK identity" <<<"$out" || fail "--sign-scale alone did not get past the option checks: $out"
echo "ok: --sign-scale alone is accepted"
