#!/usr/bin/env bash
# Regenerates the simulator experiments of docs/results.md at one commit: runs the matrix of
# edgetrain-sim and edgetrain-gan jobs (skipping those already finished, so an interrupted run resumes), then
# aggregates them over the seeds (experiments/aggregate_results.py: mean and spread, traffic ratios
# to a target, plots) into OUT/results.md and OUT/figures/. With --update-docs it puts that
# section into docs/results.md (docs/gan-results.md for the gan group alone; between the
# "regenerate:begin" and "regenerate:end" markers) and the figures into docs/figures/.
#
# usage: experiments/regenerate.sh [--out DIR] [--build DIR] [--quick] [--jobs N] [--seeds N] [--updates N]
#                           [--update-docs] [--aggregate-only] [--emulation DIR [--emulation-any-commit]
#                           [--emulation-before DIR]] [--list] [--allow-dirty]
#                           [GROUP...]
#   groups: methods rates workers reliability speeds pull gan (default: all but gan, in that order:
#           the page docs/results.md; `gan` alone makes docs/gan-results.md)
#           pull: exact delta pulls against the published model at the most workers
#           gan: MD-GAN (k = 1 and ceil(log2 N)) against FL-GAN and the standalone GAN
#           (edgetrain-gan, MLP, MNIST, N = 10, b = 10 and 100, seed 1 only; then the CNN at b = 10,
#           MD-GAN k = 1 against FL-GAN), scored with the
#           paper CNN classifier of experiments/train-classifier.sh (trained first if missing)
#   --build DIR    the host build tree with edgetrain-sim, edgetrain-gan, edgetrain-server (default build/host)
#   --quick        the CI-sized matrix: mlp on mnist-small, 300 updates, one seed (under a minute)
#   --jobs N       simulations run side by side (default: the number of cores)
#   --seeds N      seeds per setting (default 3; --quick: 1)
#   --updates N    applied updates per run (default 6000; --quick: 300)
#   --list         print the jobs and their state, run nothing
#   --emulation DIR  also put on the page the groups of an experiments/run-emulation-experiments.sh output
#                  directory (bytes at the server's socket beside the payload: `paper`, `pull100`),
#                  refused unless its runs were made at the matrix's commit (a build tree of
#                  that commit with its COMMIT file: EDGETRAIN_BUILD_DIR, emulation/README.md)
#   --emulation-any-commit  take --emulation runs of other commits (the wire measured again after
#                  a transport change, on the simulator's runs): each group names its runs' commit
#                  and date. With --aggregate-only --update-docs this remakes the page from the same
#                  simulator runs, so only the "On the wire" section changes
#   --emulation-before DIR  an older --emulation directory: one sentence per group with its older
#                  socket-bytes ratios and commit, and the older ratios in the wire's goal line
#   --aggregate-only  run no job: make the tables and plots (and with --update-docs the page)
#                  from the finished runs in OUT, at whatever commit this is; they name the
#                  commit the runs were made at (OUT/machine.json). For runs finished at an
#                  older commit (for example from a `git worktree` of it) whose tables are
#                  made with this commit's aggregate_results.py.
#   --allow-dirty  run on a work tree with uncommitted changes (the tables then say so)
# OUT (default results/) keeps one commit's runs: resuming at another commit is refused, so
# every figure of a regeneration comes from the same code. OUT/machine.json records the commit,
# the date and the CPU (XNNPACK picks its kernels by instruction set, so figures repeat exactly
# on one machine and differ slightly between machines: docs/results.md). OUT/progress.json
# says how many jobs ran, were skipped and failed (exit status 1 when any failed).
# The full matrix (132 jobs: 2 data sets x 3 seeds x 6 groups, paper CNN, 6000 updates) takes
# about 4 hours with --jobs 2 on a 2-core machine (2026-11-27: 140-260 s per single run, twice
# that for a job that runs ASGD and AdaComp), so it usually spans sessions: see docs/README.md.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host"
out=results quick=0 jobs=$(nproc) seeds= updates= update_docs=0 list=0 aggregate_only=0 emulation= allow_dirty=0 groups=() emulation_flags=()
die() { echo "regenerate.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift ;;
    --build) build=${2:?--build needs a build tree}; shift ;;
    --quick) quick=1 ;;
    --jobs) jobs=${2:?}; shift ;;
    --seeds) seeds=${2:?}; shift ;;
    --updates) updates=${2:?}; shift ;;
    --update-docs) update_docs=1 ;;
    --list) list=1 ;;
    --aggregate-only) aggregate_only=1 ;;
    --emulation) emulation=${2:?--emulation needs a directory}; shift ;;
    --emulation-any-commit) emulation_flags+=(--emulation-any-commit) ;;
    --emulation-before) emulation_flags+=(--emulation-before "${2:?--emulation-before needs a directory}"); shift ;;
    --allow-dirty) allow_dirty=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    methods|rates|workers|reliability|speeds|pull|gan) groups+=("$1") ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive number"
sim="$build/programs/edgetrain-sim" gan="$build/programs/edgetrain-gan" report="$build/programs/edgetrain-emulation-report"
[ ${#groups[@]} -gt 0 ] || groups=(methods rates workers reliability speeds pull)
for program in "$sim" "$gan" "$report"; do
  [ -x "$program" ] || die "build the host tree first (./build.sh build host): $program is missing"
done

# The GAN group's sizes (ours, for this machine's time: the paper ran I = 50,000 iterations):
# "B:ITERATIONS" per batch size, N workers, evaluations every GAN_EVAL iterations.
if [ "$quick" = 1 ]; then
  datasets=(mnist-small) model=mlp eval_every=100 worker_counts=(10 20)
  : "${seeds:=1}" "${updates:=300}"
  gan_data=mnist-small gan_workers=4 gan_sizes=(10:100) gan_eval=50 gan_cnn_sizes=()
  publish_settings=(5:0.01)
else
  datasets=(mnist fashion-mnist) model=paper-cnn eval_every=250 worker_counts=(10 50 100)
  : "${seeds:=3}" "${updates:=6000}"
  gan_data=mnist gan_workers=10 gan_sizes=(10:5000 100:1000) gan_eval=500  # the paper: every 1,000 (ours: 500, for curves of the short runs)
  # The CNN architecture at one setting (its generator costs about 15x the MLP's per sample).
  gan_cnn_sizes=(10:1000)
  # "EVERY:FRACTION" of the published model (ours, from the measurements in docs/results.md).
  publish_settings=(10:0.001 10:0.004)
fi
gan_k=$(python3 -c "import math; print(math.ceil(math.log2($gan_workers)))")
[[ "$seeds" =~ ^[1-9][0-9]*$ ]] || die "--seeds must be a positive number"
[[ "$updates" =~ ^[1-9][0-9]*$ ]] || die "--updates must be a positive number"

# ------------------------------------------------------------------ one commit per OUT
commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
dirty=false
[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ] && dirty=true
[ -z "$emulation" ] || [ -d "$emulation" ] || die "--emulation: $emulation is not a directory"
[ ${#emulation_flags[@]} -eq 0 ] || [ -n "$emulation" ] || die "--emulation-any-commit and --emulation-before need --emulation DIR"
if [ "$aggregate_only" = 1 ]; then
  [ -f "$out/machine.json" ] || die "--aggregate-only: $out holds no runs (no machine.json)"
  commit=$(jq -r .commit "$out/machine.json")
fi
if [ "$dirty" = true ] && [ "$allow_dirty" = 0 ] && [ "$list" = 0 ] && [ "$aggregate_only" = 0 ]; then
  die "the work tree has uncommitted changes: commit them first (figures name a commit), or --allow-dirty"
fi
mkdir -p "$out/jobs"
if [ -f "$out/machine.json" ]; then
  recorded=$(jq -r .commit "$out/machine.json")
  if [ "$recorded" != "$commit" ]; then
    # A later commit may resume the runs when it changed nothing they depend on: only files
    # under docs/ (for example the finished runs themselves, committed so that a matrix
    # longer than one session survives it) and the aggregation, not this script, which
    # defines the runs.
    changed=$(git -C "$repo" diff --name-only "$recorded" "$commit" -- 2>/dev/null || echo "?")
    if [ "$changed" = "?" ] ||
       { [ -n "$changed" ] && grep -qvE '^(docs/|experiments/aggregate_results\.py$)' <<<"$changed"; }; then
      die "$out holds runs of commit $recorded, this is $commit: use another --out (or remove $out)"
    fi
    echo "regenerate: resuming the runs of commit ${recorded:0:12} at ${commit:0:12} (only docs/ or the aggregation changed since)" >&2
    commit=$recorded
  fi
  # Runs resumed on another CPU model are listed (XNNPACK's kernels, and so the last digits of
  # the figures, depend on the instruction set).
  if [ "$list" = 0 ] && [ "$aggregate_only" = 0 ] && [ "$(jq -r .cpu "$out/machine.json")" != "$cpu_model" ]; then
    jq --arg cpu "$cpu_model" '.resumed_on = ((.resumed_on // []) + [$cpu] | unique)' "$out/machine.json" >"$out/machine.json.tmp"
    mv "$out/machine.json.tmp" "$out/machine.json"
  fi
  recorded_quick=$(jq -r .quick "$out/machine.json")
  [ "$recorded_quick" = "$([ "$quick" = 1 ] && echo true || echo false)" ] || die "$out holds a matrix of the other size (--quick or not)"
else
  flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'sse4_2|avx|avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni' | sort | paste -sd' ' || true)
  jq -n --arg commit "$commit" --argjson dirty "$dirty" --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --arg cpu "$cpu_model" --arg flags "$flags" \
    --argjson cores "$(nproc)" --argjson quick "$([ "$quick" = 1 ] && echo true || echo false)" \
    --argjson seeds "$seeds" --argjson updates "$updates" \
    '{commit: $commit, dirty: $dirty, date: $date, cpu: $cpu, isa: $flags, cores: $cores, quick: $quick,
      seeds: $seeds, updates: $updates}' >"$out/machine.json"
fi

# ------------------------------------------------------------------ the matrix
# Each job is one program call: "NAME<TAB>GROUP<TAB>DATA<TAB>SEED<TAB>PROGRAM ARGS", PROGRAM
# being sim (edgetrain-sim) or gan (edgetrain-gan).
job_lines=()
add_job() { # NAME GROUP DATA SEED ARGS...
  local name=$1 group=$2 data=$3 seed=$4; shift 4
  job_lines+=("$name"$'\t'"$group"$'\t'"$data"$'\t'"$seed"$'\t'"$*")
}
classifier=${EDGETRAIN_DEPS:-/var/cache/edgetrain}/classifiers/paper-cnn-mnist.safetensors
add_gan_jobs() {
  local size b iterations flags
  for size in "${gan_sizes[@]}"; do
    b=${size%%:*} iterations=${size#*:}
    flags="--data $gan_data --workers $gan_workers --batch $b --iterations $iterations --eval-every $gan_eval --seed 1"
    # Scored with the paper CNN classifier where it is there (always in the full matrix).
    [ -f "$classifier" ] && flags+=" --classifier $classifier"
    add_job "gan-md-k1-b$b-$gan_data-s1" gan "$gan_data" 1 "gan --mode md-gan --k 1 $flags"
    add_job "gan-md-k$gan_k-b$b-$gan_data-s1" gan "$gan_data" 1 "gan --mode md-gan --k $gan_k $flags"
    add_job "gan-fl-b$b-$gan_data-s1" gan "$gan_data" 1 "gan --mode fl-gan $flags"
    add_job "gan-standalone-b$b-$gan_data-s1" gan "$gan_data" 1 "gan --mode standalone $flags"
  done
  for size in ${gan_cnn_sizes[@]+"${gan_cnn_sizes[@]}"}; do
    b=${size%%:*} iterations=${size#*:}
    flags="--arch cnn --data $gan_data --workers $gan_workers --batch $b --iterations $iterations --eval-every $gan_eval --seed 1"
    [ -f "$classifier" ] && flags+=" --classifier $classifier"
    add_job "gan-cnn-md-k1-b$b-$gan_data-s1" gan "$gan_data" 1 "gan --mode md-gan --k 1 $flags"
    add_job "gan-cnn-fl-b$b-$gan_data-s1" gan "$gan_data" 1 "gan --mode fl-gan $flags"
  done
}
if [ "$quick" = 0 ] && [ "$list" = 0 ] && [ "$aggregate_only" = 0 ] && [[ " ${groups[*]} " == *" gan "* ]] && [ ! -f "$classifier" ]; then
  "$repo/experiments/train-classifier.sh" --build "$build" --out "$classifier" >&2 || die "no classifier for the gan group"
fi
for group in "${groups[@]}"; do
  if [ "$group" = gan ]; then add_gan_jobs; continue; fi
  for data in "${datasets[@]}"; do
    for ((seed = 1; seed <= seeds; seed++)); do
      base="--data $data --model $model --batch 10 --lr 0.1 --max-staleness 256 --updates $updates --eval-every $eval_every --seed $seed"
      [ "$data" = fashion-mnist ] && base+=" --eval-examples 2000"
      tag="$data-s$seed"
      case $group in
        methods)
          # ASGD and the paper's AdaComp (c = 0.01, σ rule) in one call; top-k without the
          # staleness rule; then the options one at a time, and all together at c = 0.004.
          add_job "methods-paper-$tag" methods "$data" "$seed" "sim $base --workers 10 --compressor both --rate 0.01"
          add_job "methods-norule-$tag" methods "$data" "$seed" "sim $base --workers 10 --compressor adacomp --rate 0.01 --staleness none"
          add_job "methods-ef-$tag" methods "$data" "$seed" "sim $base --workers 10 --compressor adacomp --rate 0.01 --error-feedback"
          add_job "methods-fp16-$tag" methods "$data" "$seed" "sim $base --workers 10 --compressor adacomp --rate 0.01 --fp16"
          add_job "methods-signscale-$tag" methods "$data" "$seed" "sim $base --workers 10 --compressor adacomp --rate 0.01 --sign-scale"
          add_job "methods-all-$tag" methods "$data" "$seed" "sim $base --workers 10 --compressor adacomp --rate 0.004 --error-feedback --fp16"
          ;;
        rates)
          for rate in 0.001 0.004 0.05; do
            add_job "rates-$rate-$tag" rates "$data" "$seed" "sim $base --workers 10 --compressor adacomp --rate $rate"
          done
          ;;
        workers)
          for n in "${worker_counts[@]:1}"; do
            add_job "workers-$n-$tag" workers "$data" "$seed" "sim $base --workers $n --compressor both --rate 0.01"
          done
          ;;
        reliability)
          # ours: 2% of a failing worker's steps crash; it rejoins after 50 step times or
          # leaves for good.
          for fraction in 0.1 0.3 0.5; do
            add_job "reliability-rejoin-$fraction-$tag" reliability "$data" "$seed" \
              "sim $base --workers 10 --compressor adacomp --rate 0.01 --failure-probability 0.02 --failing-fraction $fraction --downtime 50"
            add_job "reliability-leave-$fraction-$tag" reliability "$data" "$seed" \
              "sim $base --workers 10 --compressor adacomp --rate 0.01 --failure-probability 0.02 --failing-fraction $fraction --leave-for-good"
          done
          ;;
        pull)
          # Issue 13 part 4: the most workers, AdaComp c = 0.01, a pull before every step.
          # Exact delta pulls against the published model (server/README.md, "Published
          # model") at two step sizes; bytes/pull is each pull's model delta as sent.
          n=${worker_counts[-1]} pull_base=${base/--max-staleness 256/--max-staleness $((4 * ${worker_counts[-1]}))}
          add_job "pull-exact-$tag" pull "$data" "$seed" "sim $pull_base --workers $n --compressor adacomp --rate 0.01 --delta-pulls"
          for publish in "${publish_settings[@]}"; do
            add_job "pull-published-${publish/:/-}-$tag" pull "$data" "$seed" \
              "sim $pull_base --workers $n --compressor adacomp --rate 0.01 --publish-every ${publish%%:*} --publish-fraction ${publish#*:}"
          done
          ;;
        speeds)
          for spread in 0 1; do
            add_job "speeds-$spread-$tag" speeds "$data" "$seed" "sim $base --workers 10 --compressor both --rate 0.01 --speed-spread $spread"
          done
          ;;
      esac
    done
  done
done

job_done() { [ -f "$out/jobs/$1/seconds" ]; }  # written only when the job succeeded

if [ "$list" = 1 ]; then
  for line in "${job_lines[@]}"; do
    IFS=$'\t' read -r name _ _ _ args <<<"$line"
    if job_done "$name"; then state="done in $(cat "$out/jobs/$name/seconds") s"; else state=pending; fi
    printf '%-45s %-16s edgetrain-%s\n' "$name" "$state" "$args"
  done
  exit 0
fi

# ------------------------------------------------------------------ running, with an estimate
total=${#job_lines[@]} ran=0 skipped=0 failed=0 missing=0
start=$SECONDS
write_progress() {
  jq -n --argjson total "$total" --argjson ran "$ran" --argjson skipped "$skipped" --argjson failed "$failed" \
    '{total: $total, ran: $ran, skipped: $skipped, failed: $failed}' >"$out/progress.json.tmp"
  mv "$out/progress.json.tmp" "$out/progress.json"
}
human_time() { printf '%dh%02dm' $(($1 / 3600)) $(($1 % 3600 / 60)); }
report_progress() { # NAME WHAT
  local left=$((total - skipped - ran - failed)) eta="known after the first job"
  # The jobs of one matrix cost about the same (one call is one or two runs of one model):
  # the wall time so far per job finished here, times the jobs left.
  [ "$ran" -gt 0 ] && eta="about $(human_time $(( (SECONDS - start) * left / ran ))) left"
  echo "regenerate: [$((ran + failed + skipped))/$total] $1 $2; $left to run, $eta" >&2
}
run_job() { # NAME PROGRAM-AND-ARGS: runs in the background, writes into jobs/NAME
  local name=$1 kind=${2%% *} args=${2#* } dir="$out/jobs/$1" t0=$SECONDS program
  mkdir -p "$dir"
  case $kind in sim) program=$sim ;; gan) program=$gan ;; *) echo "unknown job program $kind" >"$dir/stderr"; return 1 ;; esac
  echo "build/host/programs/edgetrain-$kind $args --out $dir" >"$dir/command"
  # shellcheck disable=SC2086  # ARGS is a list of words built above
  if "$program" $args --out "$dir" --quiet >"$dir/stdout" 2>"$dir/stderr"; then
    echo "$cpu_model" >"$dir/cpu"  # the machine it ran on: a matrix may be resumed elsewhere
    echo $((SECONDS - t0)) >"$dir/seconds"
  else
    return 1
  fi
}

declare -A running=()
reap_one() {
  local pid status=0
  wait -n -p pid "${!running[@]}" || status=$?
  local name=${running[$pid]}
  unset "running[$pid]"
  if [ "$status" = 0 ]; then
    ran=$((ran + 1)); report_progress "$name" "done"
  else
    failed=$((failed + 1)); report_progress "$name" "FAILED (status $status; $out/jobs/$name/stderr)"
  fi
  write_progress
}
if [ "$aggregate_only" = 1 ]; then
  echo "regenerate: tables of the runs in $out (commit ${commit:0:12}), none run" >&2
else
  echo "regenerate: $total jobs into $out (commit ${commit:0:12}$([ "$dirty" = true ] && echo ", uncommitted changes")), $jobs at a time" >&2
fi
for line in "${job_lines[@]}"; do
  IFS=$'\t' read -r name _ _ _ args <<<"$line"
  if job_done "$name"; then skipped=$((skipped + 1)); continue; fi
  if [ "$aggregate_only" = 1 ]; then missing=$((missing + 1)); continue; fi
  while [ ${#running[@]} -ge "$jobs" ]; do reap_one; done
  run_job "$name" "$args" &
  running[$!]=$name
done
while [ ${#running[@]} -gt 0 ]; do reap_one; done
write_progress
[ "$skipped" -gt 0 ] && [ "$aggregate_only" = 0 ] && echo "regenerate: $skipped jobs were already done (resumed)" >&2
[ "$missing" -gt 0 ] && echo "regenerate: $missing of $total jobs have not run yet: the tables hold what has" >&2

# ------------------------------------------------------------------ tables and plots
printf '%s\n' "${job_lines[@]}" >"$out/jobs.tsv"
python3 "$repo/experiments/aggregate_results.py" --out "$out" --report "$report" ${emulation:+--emulation "$emulation"} \
  ${emulation_flags[@]+"${emulation_flags[@]}"}
if [ "$update_docs" = 1 ]; then
  # The gan group alone has its own page; every other matrix goes to results.md.
  doc="$repo/docs/results.md"
  [ "${groups[*]}" = gan ] && doc="$repo/docs/gan-results.md"
  grep -q '<!-- regenerate:begin -->' "$doc" && grep -q '<!-- regenerate:end -->' "$doc" ||
    die "$doc has no regenerate:begin/end markers"
  mkdir -p "$repo/docs/figures"
  cp "$out"/figures/*.svg "$repo/docs/figures/"
  cp "$out"/figures/*.png "$repo/docs/figures/" 2>/dev/null || true  # the gan group's image grids
  python3 - "$doc" "$out/results.md" <<'PY'
import sys
doc, section = sys.argv[1], open(sys.argv[2]).read()
text = open(doc).read()
begin, end = text.index("<!-- regenerate:begin -->"), text.index("<!-- regenerate:end -->")
text = text[:begin] + "<!-- regenerate:begin -->\n" + section.replace("](figures/", "](figures/") + text[end:]
open(doc + ".tmp", "w").write(text)
PY
  mv "$doc.tmp" "$doc"
  echo "regenerate: ${doc#"$repo/"} and docs/figures/ updated" >&2
fi
[ "$failed" = 0 ] || { echo "regenerate: $failed jobs failed" >&2; exit 1; }
echo "regenerate: tables in $out/results.md, plots in $out/figures/" >&2
