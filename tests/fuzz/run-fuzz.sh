#!/usr/bin/env bash
# Builds the codec fuzz target with clang/libFuzzer (ASan + UBSan) in build/fuzz and runs it
# for a bounded time (default 60 s; first argument or EDGETRAIN_FUZZ_SECONDS). Prints one
# summary line; on a crash it prints the end of the log and the reproducer's path and fails.
# Every input in tests/fuzz/regressions (crashes found before, kept) is replayed first. Under
# CI the fuzzer's seed is fixed (EDGETRAIN_FUZZ_SEED, default 1 there, random elsewhere) so a
# CI run explores the same inputs each time; run it locally for long, random searches.
# Then the NumPy reader's target (npy_fuzz: .npy and .npz files of a user's data directory,
# model/numpy_file.cc) for EDGETRAIN_FUZZ_NPY_SECONDS (default 20), from the seeds in
# tests/fuzz/npy-seeds (a mode byte, then a file NumPy wrote); and the CSV and description
# reader's (user_data_fuzz: CSV files and edgetrain-data.toml, model/user_data.cc) for
# EDGETRAIN_FUZZ_USER_DATA_SECONDS (default 15), from tests/fuzz/user-data-seeds.
#   tests/fuzz/run-fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
seconds="${1:-${EDGETRAIN_FUZZ_SECONDS:-60}}"
build=build/fuzz
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (Debian packages clang and libclang-rt-14-dev; run ./build.sh setup)" >&2; exit 1; }
mkdir -p "$build"
cmake -S tests/fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log" >&2; echo "fuzz: configure failed" >&2; exit 1; }
cmake --build "$build" -j2 >"$build/build.log" 2>&1 || { tail -n 30 "$build/build.log" >&2; echo "fuzz: build failed" >&2; exit 1; }

corpus="$build/corpus"; artifacts="$build/artifacts"
mkdir -p "$corpus" "$artifacts"
"$build/codec_fuzz_seeds" "$corpus" >/dev/null
regressions=tests/fuzz/regressions
if ls "$regressions"/* >/dev/null 2>&1; then
  "$build/codec_fuzz" "$regressions"/* >"$build/regressions.log" 2>&1 \
    || { tail -n 40 "$build/regressions.log" >&2; echo "fuzz: a kept regression input fails again (log: $build/regressions.log)" >&2; exit 1; }
  echo "fuzz: $(ls "$regressions" | wc -l) regression input(s) in $regressions pass"
fi
seed_flag=()
if [[ -n "${EDGETRAIN_FUZZ_SEED:-}" ]]; then seed_flag=(-seed="$EDGETRAIN_FUZZ_SEED")
elif [[ "${CI:-}" == true ]]; then seed_flag=(-seed=1); fi
log="$build/codec_fuzz.log"
if "$build/codec_fuzz" "${seed_flag[@]}" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
     -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus" >"$log" 2>&1; then
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  echo "fuzz: codec_fuzz ran ${runs:-?} inputs in ${seconds} s without a failure (corpus: $(ls "$corpus" | wc -l) files, log: $log)"
else
  tail -n 40 "$log" >&2
  echo "fuzz: codec_fuzz FAILED; reproducer(s) in $artifacts, log: $log" >&2
  echo "fuzz: once fixed, keep the reproducer: cp $artifacts/crash-* $regressions/" >&2
  exit 1
fi

# A data-file reader's target for a bounded time, from its seed directory.
run_reader_target() {
  local target=$1 seconds=$2 seeds=$3
  local corpus="$build/$target-corpus" log="$build/$target.log"
  mkdir -p "$corpus"
  cp "$seeds"/* "$corpus/"
  if "$build/$target" "${seed_flag[@]}" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
       -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    echo "fuzz: $target ran ${runs:-?} inputs in ${seconds} s without a failure (log: $log)"
  else
    tail -n 40 "$log" >&2
    echo "fuzz: $target FAILED; reproducer(s) in $artifacts, log: $log" >&2
    exit 1
  fi
}
run_reader_target npy_fuzz "${EDGETRAIN_FUZZ_NPY_SECONDS:-20}" tests/fuzz/npy-seeds
run_reader_target user_data_fuzz "${EDGETRAIN_FUZZ_USER_DATA_SECONDS:-15}" tests/fuzz/user-data-seeds
