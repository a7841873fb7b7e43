#!/usr/bin/env bash
# The emulation experiment matrix of docs/emulation-results.md: every run is one edgetrain-emulate
# call (real server, real workers, DTLS, link impairer); every group is compared by
# edgetrain-emulation-report (ratio against the group's first run, ASGD). Writes one
# directory per run and per group under OUT (default emulation-results/), and with
# --update-docs replaces the emulation section of docs/emulation-results.md (between the
# "emulation:begin" and "emulation:end" markers) with the tables and their commands.
#
# usage: experiments/run-emulation-experiments.sh [--out DIR] [--update-docs] [GROUP...]
#   groups: paper rates failures scale50 scale100 speeds pull100 distreal distreal-fashion
#           distreal-skew (default: all, in that order); also paper-pull10 and the gossip groups
#     paper    paper CNN, 10 workers, to 97 %: ASGD, AdaComp c = 0.01, c = 0.004 + EF + fp16,
#              sign + scale (the wire's side of docs/results.md's methods table)
#     paper-pull10  AdaComp c = 0.01 with a pull every 10 steps, against paper's ASGD run
#     speeds   paper CNN, 10 workers: real CPU quotas per worker (cgroups), four speed classes
#              against equal shares of the same total (two cores)
#     pull100  paper CNN, 100 workers, a pull before every step: exact model deltas against the
#              published model (server/README.md), socket bytes into and out of the server
#     distreal distreal-fashion  paper CNN, 20 workers in four CPU classes whose quotas change
#              during the run: FedAvg wait-all, FedAvg drop-stragglers, a static width per
#              class (HeteroFL-style), DISTREAL (run-time choice from the dropout table
#              boards/paper-cnn-dropout-table.json) and asynchronous AdaComp (issue 14);
#              MNIST, and Fashion-MNIST
#     distreal-skew  the same on MNIST with label-skewed shards: FedAvg drop-stragglers
#              against DISTREAL (with i.i.d. shards a dropped board's data is also elsewhere)
#     gossip   paper CNN, MNIST, 16 gossip peers in four CPU classes, no server (issue 15):
#              D-PSGD compressed and dense, AD-PSGD, balanced and accuracy-aware gossip on a
#              ring and a random 4-regular graph, and asynchronous AdaComp with a server on
#              the same fleet
#     gossip-impaired  balanced compressed gossip and AdaComp behind WAN-like links
#     gossip32 32 peers in the same classes at half the shares (the machine has two cores)
#     gossip-fashion  the same 16 peers on Fashion-MNIST: compressed D-PSGD with and without
#              balancing, and asynchronous AdaComp with a server
#     gossip-aware  the accuracy-aware run of the gossip group again, with the balanced
#              learning rate capped at 2x (--max-lr-factor 2; uncapped it diverged)
#     gossip-wait  training while waiting (--wait-steps 16): the gossip group's 16 peers on a
#              ring, compressed D-PSGD with and without it, on MNIST and Fashion-MNIST (the
#              runs without it are the gossip and gossip-fashion groups' first runs)
#     shards   paper CNN, 10 workers, a pull before every step: one server against a sharded
#              server of 4 shard processes (issue 17), each killed once mid-run (the server,
#              or shard 2) and recovered
# Each group's section names the commit its runs were made at (RUN.commit beside each run, and
# RUN.date, the day it started, and RUN.load, the load averages when it ended and the cores).
# Takes about an hour on an idle 2-core machine (each run stops at its target accuracy or
# its time limit).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
emulate="$repo/emulation/edgetrain-emulate"
report="$repo/build/host/programs/edgetrain-emulation-report"
out=emulation-results update_docs=0 groups=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --update-docs) update_docs=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    paper|paper-pull10|rates|failures|scale50|scale100|speeds|pull100|distreal|distreal-fashion|distreal-skew|gossip|gossip-impaired|gossip32|gossip-fashion|gossip-aware|gossip-wait|shards) groups+=("$1") ;;
    *) echo "run-emulation-experiments.sh: unknown argument '$1'" >&2; exit 1 ;;
  esac
  shift
done
[ ${#groups[@]} -gt 0 ] || groups=(paper rates failures scale50 scale100 speeds pull100 distreal distreal-fashion distreal-skew
                                    gossip gossip-impaired gossip32 gossip-fashion gossip-aware gossip-wait shards)
# EDGETRAIN_BUILD_DIR: the host build tree the runs use (default build/host); a copy keeps a
# long matrix's programs fixed while the tree is rebuilt (its COMMIT file, if any, names the
# commit they were built at). Run a long matrix from a worktree of its own: bash reads a
# script as it goes, so editing edgetrain-emulate under a running matrix breaks the run.
build_flags=()
[ -z "${EDGETRAIN_BUILD_DIR:-}" ] || { build_flags=(--build-dir "$EDGETRAIN_BUILD_DIR"); report="$EDGETRAIN_BUILD_DIR/programs/edgetrain-emulation-report"; }
mkdir -p "$out"

# run NAME ARGS...: one emulation into $out/NAME (skipped when it already finished, so an
# interrupted matrix resumes).
run() {
  local name=$1; shift
  # The command of the table, quoted for a shell (also for a run done earlier).
  mkdir -p "$out/$name"
  # (paths inside the repository as the table's reader would type them, from its root)
  echo "emulation/edgetrain-emulate --out $(printf '%q' "$out/$name")$(printf ' %q' "$@")" | sed "s|$repo/||g" >"$out/$name.command"
  # Done: its report was written (a gossip run behind slow links may have no evaluation in
  # its timeline and is still done).
  if [ -s "$out/$name/outcome.json" ] || { [ -s "$out/$name/timeline.csv" ] && [ -s "$out/$name/workers.csv" ]; }; then
    echo "== $name: already done"
    return
  fi
  echo "== $name: edgetrain-emulate $*"
  # The commit the programs were built at: the build tree's COMMIT file when it has one (a
  # copied tree keeps a matrix's programs fixed while the repository moves on).
  if [ -n "${EDGETRAIN_BUILD_DIR:-}" ] && [ -s "$EDGETRAIN_BUILD_DIR/COMMIT" ]; then
    cp "$EDGETRAIN_BUILD_DIR/COMMIT" "$out/$name.commit"
  else
    git -C "$repo" rev-parse --short=12 HEAD >"$out/$name.commit"
  fi
  date -u +%Y-%m-%d >"$out/$name.date"  # the day the run started, named beside its commit on the page
  "$emulate" --out "$out/$name" --quiet ${build_flags[@]+"${build_flags[@]}"} "$@" || echo "== $name: edgetrain-emulate exited with status $?"
  # The 5- and 15-minute load averages at the end (the run's own processes included): times to
  # target on a machine shared with other work are slower, and the page says how busy it was.
  echo "$(cut -d' ' -f2,3 /proc/loadavg) $(nproc)" >"$out/$name.load"
}
# group_section TITLE TARGET|auto RUN...: the group's table (ratio against the first run) and plots.
group_section() {
  local title=$1 target=$2; shift 2
  local dirs=() r
  for r in "$@"; do dirs+=("$out/$r"); done
  # auto: half a point below the lowest best accuracy of the group (the report's default)
  local target_flag=(--target-accuracy "$target")
  [ "$target" = auto ] && target_flag=()
  "$report" "${dirs[@]}" --out "$out/group-$title" "${target_flag[@]}" >/dev/null
  case "$title" in
    paper) echo "### The paper's setting: paper CNN, 10 workers, a pull before every step, clean links" ;;
    rates) echo "### Compression rates: MLP, 10 workers, clean links" ;;
    failures) echo "### Heterogeneity and failures: MLP, 10 workers" ;;
    failures-adacomp) echo "### Heterogeneity and failures, AdaComp runs among themselves: MLP, 10 workers" ;;
    scale50) echo "### Scale: MLP, 50 workers, clean links" ;;
    scale100) echo "### Scale: MLP, 100 workers, heterogeneous + failures" ;;
    scale100-clean) echo "### Scale: MLP, 100 workers, homogeneous, no failures" ;;
    speeds) echo "### Speed classes with real CPU quotas: paper CNN, 10 workers, the same two cores in total" ;;
    pull100) echo "### Pulls at 100 workers: paper CNN, a pull before every step, exact deltas against the published model" ;;
    shards) echo "### A sharded server: paper CNN, 10 workers, one server against 4 shards, each killed once and recovered" ;;
    distreal) echo "### Federated rounds and DISTREAL: paper CNN, MNIST, 20 workers in four CPU classes, quotas changing during the run" ;;
    distreal-fashion) echo "### Federated rounds and DISTREAL: paper CNN, Fashion-MNIST, 20 workers in four CPU classes, quotas changing during the run" ;;
    distreal-skew) echo "### Federated rounds and DISTREAL with label-skewed shards: paper CNN, MNIST, as above" ;;
    *) echo "### $title" ;;
  esac
  echo
  local commits
  commits=$(for r in "$@"; do cat "$out/$r.commit" 2>/dev/null || echo unknown; done | sort -u | paste -sd, | sed 's/,/, /g')
  echo "Runs made at commit $commits."
  echo
  cat "$out/group-$title/summary.md"
  echo
  echo "Commands (from the repository root, after \`cmake --build build/host\`):"
  echo
  echo '```sh'
  for r in "$@"; do cat "$out/$r.command"; done
  echo '```'
  echo
  if [ "$update_docs" = 1 ]; then
    cp "$out/group-$title/accuracy-vs-ingress.svg" "$repo/docs/figures/emulation-$title-accuracy-vs-ingress.svg"
    cp "$out/group-$title/accuracy-vs-time.svg" "$repo/docs/figures/emulation-$title-accuracy-vs-time.svg"
    echo "![$title: accuracy against socket ingress](figures/emulation-$title-accuracy-vs-ingress.svg)"
    echo "![$title: accuracy against time](figures/emulation-$title-accuracy-vs-time.svg)"
    echo
  fi
  echo "Per-run details (workers.csv, links.csv, events.log, summary.md, logs) in \`$out/<run>/\`."
  echo
}

# gossip_section TITLE TARGET RUN...: gossip runs (and a server run of the same fleet) by
# edgetrain-emulation-report gossip-compare; the first run is the reference of the speed-up.
gossip_section() {
  local title=$1 target=$2; shift 2
  local dirs=() r
  for r in "$@"; do [ -f "$out/$r/outcome.json" ] && dirs+=("$out/$r"); done
  [ ${#dirs[@]} -gt 0 ] || return 0
  "$report" gossip-compare "${dirs[@]}" --out "$out/group-$title" --target-accuracy "$target" >/dev/null
  case "$title" in
    gossip) echo "### Gossip without a server: paper CNN, MNIST, 16 peers in four CPU classes, clean links" ;;
    gossip-impaired) echo "### Gossip without a server behind WAN-like links: paper CNN, MNIST, 16 peers" ;;
    gossip32) echo "### Gossip without a server: paper CNN, MNIST, 32 peers at half the shares" ;;
    gossip-fashion) echo "### Gossip without a server: paper CNN, Fashion-MNIST, 16 peers in four CPU classes, clean links" ;;
    gossip-aware) echo "### Accuracy-aware gossip with the balanced learning rate capped: paper CNN, MNIST, 16 peers" ;;
    gossip-wait) echo "### Gossip peers that train while they wait: paper CNN, MNIST, 16 peers in four CPU classes, ring" ;;
    gossip-wait-fashion) echo "### Gossip peers that train while they wait: paper CNN, Fashion-MNIST, 16 peers, ring" ;;
  esac
  echo
  echo "Runs made at commit $(for r in "$@"; do cat "$out/$r.commit" 2>/dev/null; done | sort -u | paste -sd, | sed 's/,/, /g')."
  echo
  cat "$out/group-$title/summary.md"
  echo
  echo '```sh'
  for r in "$@"; do [ ! -f "$out/$r.command" ] || cat "$out/$r.command"; done
  echo '```'
  echo
  if [ "$update_docs" = 1 ]; then
    cp "$out/group-$title/accuracy-vs-time.svg" "$repo/docs/figures/emulation-$title-accuracy-vs-time.svg"
    cp "$out/group-$title/accuracy-vs-bytes.svg" "$repo/docs/figures/emulation-$title-accuracy-vs-bytes.svg"
    echo "![$title: accuracy against time](figures/emulation-$title-accuracy-vs-time.svg)"
    echo "![$title: accuracy against bytes per device](figures/emulation-$title-accuracy-vs-bytes.svg)"
    echo
  fi
}

# The paper's setting: paper CNN, 10 workers, batch 10, lr 0.1, c = 0.01, a pull before
# every step (the paper's worker), clean links in namespaces.
# To 97 % on the whole test set (the simulator's target, ASGD's best less 0.3 points, is
# ~97.8 %: more than ASGD reaches here in reasonable time; ours).
paper_common=(--workers 10 --model paper-cnn --pull-every 1 --target-accuracy 0.97 --duration 1200 --request-timeout 60
              --eval-interval 5 --eval-examples 10000)
# The MLP matrix: cheap enough for 100 worker processes on 2 cores. A pull every 10 steps
# (a dense MLP pull is 400 blocks); the staleness bound grows with the fleet.
mlp_common=(--model mlp --pull-every 10 --target-accuracy 0.85 --duration 180)
hetero=(--slowdown 0:3 --link delay=1:20,jitter=2,loss=0.001,bandwidth=5000:50000)
for g in "${groups[@]}"; do
  case "$g" in
    paper)
      run paper-asgd "${paper_common[@]}" --compressor none --label "ASGD (paper CNN, 10 workers)"
      run paper-adacomp "${paper_common[@]}" --compressor adacomp --rate 0.01 --label "AdaComp c=0.01 (paper CNN, 10 workers)"
      run paper-options "${paper_common[@]}" --compressor adacomp --rate 0.004 --error-feedback --fp16 \
        --label "AdaComp c=0.004 + EF + fp16 (paper CNN, 10 workers)"
      run paper-signscale "${paper_common[@]}" --compressor adacomp --rate 0.01 --sign-scale \
        --label "AdaComp c=0.01, sign + scale (paper CNN, 10 workers)" ;;
    paper-pull10)
      # A pull every 10 steps with plain AdaComp (no error feedback: with EF the residual
      # re-sends the same gradient at the same stale parameters and the run diverged).
      run paper-adacomp-pull10 "${paper_common[@]}" --compressor adacomp --rate 0.01 --pull-every 10 \
        --label "AdaComp c=0.01, pull every 10 (paper CNN, 10 workers)" ;;
    rates)
      run rates-asgd "${mlp_common[@]}" --workers 10 --compressor none --label "ASGD (MLP, 10)"
      for c in 0.1 0.01 0.001; do
        run "rates-adacomp-$c" "${mlp_common[@]}" --workers 10 --compressor adacomp --rate "$c" --label "AdaComp c=$c (MLP, 10)"
      done ;;
    failures)
      fail=(--fail kill-worker:3@20+5,kill-worker:7@40+5,kill-server@60+3)
      run fh-asgd "${mlp_common[@]}" --workers 10 --compressor none "${hetero[@]}" "${fail[@]}" --label "ASGD, heterogeneous + failures (MLP, 10)"
      run fh-adacomp "${mlp_common[@]}" --workers 10 --rate 0.01 --label "AdaComp c=0.01, homogeneous (MLP, 10)"
      run fh-adacomp-hetero "${mlp_common[@]}" --workers 10 --rate 0.01 "${hetero[@]}" --label "AdaComp c=0.01, heterogeneous (MLP, 10)"
      run fh-adacomp-fail "${mlp_common[@]}" --workers 10 --rate 0.01 "${fail[@]}" --label "AdaComp c=0.01, failures (MLP, 10)"
      run fh-adacomp-both "${mlp_common[@]}" --workers 10 --rate 0.01 "${hetero[@]}" "${fail[@]}" --label "AdaComp c=0.01, heterogeneous + failures (MLP, 10)" ;;
    scale50)
      run s50-asgd "${mlp_common[@]}" --workers 50 --max-staleness 200 --compressor none --label "ASGD (MLP, 50)"
      run s50-adacomp "${mlp_common[@]}" --workers 50 --max-staleness 200 --rate 0.01 --label "AdaComp c=0.01 (MLP, 50)" ;;
    scale100)
      fail100=(--fail kill-worker:10@30+10,kill-worker:55@60+10,kill-server@90+3)
      run s100-asgd "${mlp_common[@]}" --workers 100 --max-staleness 400 --compressor none "${hetero[@]}" "${fail100[@]}" \
        --duration 300 --label "ASGD, heterogeneous + failures (MLP, 100)"
      run s100-adacomp "${mlp_common[@]}" --workers 100 --max-staleness 400 --rate 0.01 "${hetero[@]}" "${fail100[@]}" \
        --duration 300 --label "AdaComp c=0.01, heterogeneous + failures (MLP, 100)"
      run s100-asgd-clean "${mlp_common[@]}" --workers 100 --max-staleness 400 --compressor none --duration 300 \
        --label "ASGD, homogeneous, no failures (MLP, 100)"
      run s100-adacomp-clean "${mlp_common[@]}" --workers 100 --max-staleness 400 --rate 0.01 --duration 300 \
        --label "AdaComp c=0.01, homogeneous, no failures (MLP, 100)" ;;
    speeds)
      # Ours: four classes named after the boards, shares of one core in the ratio of their
      # speeds, 0.2 of a core on average (10 workers share the machine's two cores); "equal"
      # gives every worker that average.
      classes=pi5=0.35,pi4=0.25,pi3=0.12,zero2w=0.08
      speeds_common=(--workers 10 --model paper-cnn --pull-every 1 --target-accuracy 0.92 --duration 600 --request-timeout 60)
      run speeds-asgd-equal "${speeds_common[@]}" --compressor none --cpu-classes equal=0.2 \
        --label "ASGD, equal CPU (paper CNN, 10 workers)"
      run speeds-asgd-classes "${speeds_common[@]}" --compressor none --cpu-classes "$classes" \
        --label "ASGD, speed classes (paper CNN, 10 workers)"
      run speeds-adacomp-equal "${speeds_common[@]}" --rate 0.01 --cpu-classes equal=0.2 \
        --label "AdaComp c=0.01, equal CPU (paper CNN, 10 workers)"
      run speeds-adacomp-classes "${speeds_common[@]}" --rate 0.01 --cpu-classes "$classes" \
        --label "AdaComp c=0.01, speed classes (paper CNN, 10 workers)" ;;
    pull100)
      pull_common=(--workers 100 --model paper-cnn --pull-every 1 --max-staleness 400 --rate 0.01 --duration 240
                   --request-timeout 60 --eval-interval 5)
      run pull100-exact "${pull_common[@]}" --label "AdaComp c=0.01, exact deltas (paper CNN, 100 workers)"
      run pull100-published "${pull_common[@]}" --publish-every 10 --publish-fraction 0.001 \
        --label "AdaComp c=0.01, published every 10 at 0.001 (paper CNN, 100 workers)" ;;
    distreal|distreal-fashion|distreal-skew)
      # Ours: four classes, shares of one core in the ratio of the boards' speeds, 1.4 cores
      # in all (the server needs the rest); a background load halves every board's share
      # from 60 to 120 s, and another takes 60% of the Pi 5s' from 150 to 240 s. A round is
      # 100 local steps (a dense pull and push cost about 40 steps of CPU); the deadline of
      # 11 s lets the slowest class finish with the thinnest point of the table.
      dataset=mnist prefix=distreal skew=()
      [ "$g" = distreal-fashion ] && dataset=fashion-mnist prefix=distreal-fashion
      [ "$g" = distreal-skew ] && prefix=distreal-skew skew=(--label-skew)
      classes=pi5=0.12,pi4=0.08,pi3=0.05,zero2w=0.03
      dcommon=(--workers 20 --model paper-cnn --data "$dataset" --cpu-classes "$classes"
               --cpu-schedule 60-120:0.5,150-240:0.4@pi5 --duration 300 --eval-interval 5 --request-timeout 60
               ${skew[@]+"${skew[@]}"})
      if [ "$g" = distreal-skew ]; then
        run "$prefix-drop" "${dcommon[@]}" --mode rounds --compressor none --local-steps 100 --local-lr 0.05 \
          --round-deadline 11 --round-policy drop-stragglers --label "FedAvg, drop stragglers, label skew"
        run "$prefix-distreal" "${dcommon[@]}" --mode rounds --compressor none --local-steps 100 --local-lr 0.05 \
          --round-deadline 11 --round-policy drop-stragglers --dropout-table "$repo/boards/paper-cnn-dropout-table.json" \
          --label "DISTREAL (run-time choice), label skew"
        continue
      fi
      rounds=(--mode rounds --compressor none --local-steps 100 --local-lr 0.05 --round-deadline 11)
      run "$prefix-waitall" "${dcommon[@]}" "${rounds[@]}" --round-policy wait-all --label "FedAvg, wait for all"
      run "$prefix-drop" "${dcommon[@]}" "${rounds[@]}" --round-policy drop-stragglers --label "FedAvg, drop stragglers"
      run "$prefix-static" "${dcommon[@]}" "${rounds[@]}" --round-policy drop-stragglers \
        --class-drop-rates pi5=0:0,pi4=0:0.25,pi3=0.25:0.25,zero2w=0.5:0.5 --label "static width per class (HeteroFL-style)"
      run "$prefix-distreal" "${dcommon[@]}" "${rounds[@]}" --round-policy drop-stragglers \
        --dropout-table "$repo/boards/paper-cnn-dropout-table.json" --label "DISTREAL (run-time choice)"
      run "$prefix-async" "${dcommon[@]}" --mode async --compressor adacomp --rate 0.01 --pull-every 1 \
        --label "asynchronous AdaComp c=0.01" ;;
    shards)
      # The paper's setting to 95 %, every evaluation on the whole test set (the sharded run
      # evaluates the model assembled from the shards' checkpoints, written every 50
      # updates); the one server is killed at 30 s, the sharded server's shard 2 likewise.
      shards_common=(--workers 10 --model paper-cnn --pull-every 1 --rate 0.01 --target-accuracy 0.95 --duration 480
                     --request-timeout 60 --eval-interval 3 --eval-examples 10000)
      run shards-one-server "${shards_common[@]}" --fail kill-server@30+3 --label "one server (paper CNN, 10 workers)"
      run shards-4 "${shards_common[@]}" --shards 4 --fail kill-shard:2@30+3 --label "4 shards (paper CNN, 10 workers)" ;;
    gossip|gossip-impaired|gossip32|gossip-fashion|gossip-aware|gossip-wait)
      # Ours: the classes of the DISTREAL groups (1.12 cores for 16 peers), fixed for the run;
      # 32 peers get half of each share so the fleet still fits the machine's two cores.
      # Evaluations every 15 s on 1,000 test images (a fleet evaluation takes several
      # seconds of a core); 360 s per run, no early stop, so every run has a final accuracy.
      # Balancing: a step's target time of 0.06 s, at which the fleet's sixteen batches add
      # up to about vanilla gossip's 160 examples per iteration (measured speeds: ~300, 215,
      # 130 and 70 examples/s by class). At 0.15 s the Pi 5s' batches grew to 48 and their
      # learning rate to 0.48 (linear rule), and the fleet diverged. Compressed gossip moves
      # 1% of each tensor per iteration (gamma 0.1).
      # 32 peers are evaluated every 30 s: an evaluation of 33 models takes a core for ~20 s.
      classes=pi5=0.12,pi4=0.08,pi3=0.05,zero2w=0.03 n=16 prefix=g16 every=15
      [ "$g" = gossip32 ] && classes=pi5=0.06,pi4=0.04,pi3=0.025,zero2w=0.015 n=32 prefix=g32 every=30
      gdata=mnist
      [ "$g" = gossip-fashion ] && gdata=fashion-mnist
      gcommon=(--workers "$n" --model paper-cnn --data "$gdata" --cpu-classes "$classes" --duration 360 --eval-interval "$every"
               --eval-examples 1000 --target-accuracy 0 --request-timeout 60)
      gossip=(--mode gossip --local-lr 0.1 --batch 10)
      compressed=(--gossip-publish-fraction 0.01)
      balanced=(--balance-target 0.06)
      wan=()
      [ "$g" = gossip-impaired ] && prefix=g16-wan wan=(--link delay=5:20,jitter=2,bandwidth=5000:50000)
      [ "$g" = gossip-fashion ] && prefix=g16-fashion
      if [ "$g" = gossip-wait ]; then
        # A peer takes up to 16 more local steps per iteration while a neighbour is behind
        # (worker/README.md "Gossip"); the same runs without it first, as the reference.
        for gdata in mnist fashion-mnist; do
          prefix=g16 && [ "$gdata" = fashion-mnist ] && prefix=g16-fashion
          gcommon=(--workers "$n" --model paper-cnn --data "$gdata" --cpu-classes "$classes" --duration 360
                   --eval-interval "$every" --eval-examples 1000 --target-accuracy 0 --request-timeout 60)
          run "$prefix-ring-compressed" "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
            --label "D-PSGD compressed, ring"
          run "$prefix-ring-compressed-wait16" "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
            --wait-steps 16 --label "D-PSGD compressed + training while waiting (at most 16), ring"
        done
        continue
      fi
      if [ "$g" = gossip-aware ]; then
        # The gossip group's accuracy-aware run, whose balanced learning rate reached 8x
        # (0.8) on the fastest class and diverged, with the cap at 2x.
        run g16-ring-compressed-balanced-aware-cap2 "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
          "${balanced[@]}" --plateau-patience 3 --validate-every 25 --max-lr-factor 2 \
          --label "compressed + balancing (lr cap 2) + accuracy-aware, ring"
        run g16-ring-compressed-balanced-cap2 "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
          "${balanced[@]}" --max-lr-factor 2 --label "D-PSGD compressed + balancing (lr cap 2), ring"
        continue
      fi
      if [ "$g" = gossip ]; then
        run g16-ring-compressed "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
          --label "D-PSGD compressed, ring"
        run g16-ring-compressed-balanced "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" "${balanced[@]}" \
          --label "D-PSGD compressed + balancing, ring"
        run g16-ring-dense "${gcommon[@]}" "${gossip[@]}" --topology ring --label "D-PSGD dense, ring"
        run g16-ring-adpsgd "${gcommon[@]}" "${gossip[@]}" --topology ring --gossip ad-psgd --label "AD-PSGD, ring"
        run g16-adacomp "${gcommon[@]}" --mode async --compressor adacomp --rate 0.01 --pull-every 1 \
          --label "AdaComp c=0.01 with a server"
        run g16-rr4-compressed "${gcommon[@]}" "${gossip[@]}" --topology random-regular --degree 4 "${compressed[@]}" \
          --label "D-PSGD compressed, random 4-regular"
        run g16-rr4-compressed-balanced "${gcommon[@]}" "${gossip[@]}" --topology random-regular --degree 4 \
          "${compressed[@]}" "${balanced[@]}" --label "D-PSGD compressed + balancing, random 4-regular"
        run g16-ring-compressed-balanced-aware "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
          "${balanced[@]}" --plateau-patience 3 --validate-every 25 --label "compressed + balancing + accuracy-aware, ring"
      else
        run "$prefix-ring-compressed" "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
          ${wan[@]+"${wan[@]}"} --label "D-PSGD compressed, ring"
        run "$prefix-ring-compressed-balanced" "${gcommon[@]}" "${gossip[@]}" --topology ring "${compressed[@]}" \
          "${balanced[@]}" ${wan[@]+"${wan[@]}"} --label "D-PSGD compressed + balancing, ring"
        run "$prefix-adacomp" "${gcommon[@]}" --mode async --compressor adacomp --rate 0.01 --pull-every 1 \
          ${wan[@]+"${wan[@]}"} --label "AdaComp c=0.01 with a server"
      fi ;;
  esac
done

# Tables of every group whose runs exist.
section="$out/results-section.md"
{
  echo "<!-- emulation:begin (written by experiments/run-emulation-experiments.sh --update-docs) -->"
  echo "## The emulator (real programs, bytes at the server's socket)"
  echo
  echo "Assembled by \`experiments/run-emulation-experiments.sh --update-docs\` at commit \`$(git -C "$repo" rev-parse --short=12 HEAD)\`" \
       "on $(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))." \
       "One run per row; each group names the commit its runs were made at. Groups not listed here have not" \
       "been run since the full-MNIST change (earlier ones: history.md)."
  echo
  [ -d "$out/paper-asgd" ] && group_section paper 0.97 paper-asgd paper-adacomp paper-options paper-signscale
  [ -d "$out/paper-adacomp-pull10" ] && [ -d "$out/paper-asgd" ] && group_section paper-pull10 0.97 paper-asgd paper-adacomp-pull10
  [ -d "$out/rates-asgd" ] && group_section rates auto rates-asgd rates-adacomp-0.1 rates-adacomp-0.01 rates-adacomp-0.001
  [ -d "$out/fh-asgd" ] && group_section failures auto fh-asgd fh-adacomp fh-adacomp-hetero fh-adacomp-fail fh-adacomp-both
  # ASGD reaches only ~50% in those conditions: the AdaComp runs among themselves at 84.5%.
  [ -d "$out/fh-adacomp" ] && group_section failures-adacomp 0.845 fh-adacomp fh-adacomp-hetero fh-adacomp-fail fh-adacomp-both
  [ -d "$out/s50-asgd" ] && group_section scale50 auto s50-asgd s50-adacomp
  [ -d "$out/s100-asgd" ] && group_section scale100 auto s100-asgd s100-adacomp
  [ -d "$out/s100-asgd-clean" ] && group_section scale100-clean auto s100-asgd-clean s100-adacomp-clean
  [ -d "$out/speeds-asgd-equal" ] && group_section speeds 0.92 speeds-asgd-equal speeds-asgd-classes speeds-adacomp-equal speeds-adacomp-classes
  [ -d "$out/pull100-exact" ] && group_section pull100 auto pull100-exact pull100-published
  [ -d "$out/shards-one-server" ] && group_section shards 0.95 shards-one-server shards-4
  [ -d "$out/distreal-waitall" ] && group_section distreal 0.97 distreal-waitall distreal-drop distreal-static distreal-distreal distreal-async
  [ -d "$out/distreal-fashion-waitall" ] && group_section distreal-fashion 0.85 distreal-fashion-waitall distreal-fashion-drop \
    distreal-fashion-static distreal-fashion-distreal distreal-fashion-async
  [ -d "$out/distreal-skew-drop" ] && group_section distreal-skew auto distreal-skew-drop distreal-skew-distreal
  # Gossip: 95% (six minutes do not take every peer to 97%); the reference of the speed-up is
  # compressed D-PSGD, the vanilla gossip that reaches the target here (dense gossip does not).
  [ -d "$out/g16-ring-compressed" ] && gossip_section gossip 0.95 g16-ring-compressed g16-ring-dense g16-ring-adpsgd \
    g16-ring-compressed-balanced g16-ring-compressed-balanced-aware g16-rr4-compressed g16-rr4-compressed-balanced g16-adacomp
  # Behind WAN-like links and with 32 peers at half the shares: 90%.
  [ -d "$out/g16-wan-ring-compressed" ] && gossip_section gossip-impaired 0.9 g16-wan-ring-compressed \
    g16-wan-ring-compressed-balanced g16-wan-adacomp
  [ -d "$out/g32-ring-compressed" ] && gossip_section gossip32 0.9 g32-ring-compressed g32-ring-compressed-balanced g32-adacomp
  # Fashion-MNIST: 85% (the simulator's target for it). The accuracy-aware rerun against the
  # gossip group's reference, compressed D-PSGD, when that run is in the same OUT.
  [ -d "$out/g16-fashion-ring-compressed" ] && gossip_section gossip-fashion 0.80 g16-fashion-ring-compressed \
    g16-fashion-ring-compressed-balanced g16-fashion-adacomp
  [ -d "$out/g16-ring-compressed-balanced-aware-cap2" ] && gossip_section gossip-aware 0.95 g16-ring-compressed \
    g16-ring-compressed-balanced-cap2 g16-ring-compressed-balanced-aware-cap2
  # Training while waiting: 95% on MNIST, 80% on Fashion-MNIST (the gossip-fashion group's).
  [ -d "$out/g16-ring-compressed-wait16" ] && gossip_section gossip-wait 0.95 g16-ring-compressed g16-ring-compressed-wait16
  [ -d "$out/g16-fashion-ring-compressed-wait16" ] && gossip_section gossip-wait-fashion 0.80 g16-fashion-ring-compressed \
    g16-fashion-ring-compressed-wait16
  echo "<!-- emulation:end -->"
} >"$section" 2>"$out/report-errors.log" || true
echo "tables: $section"
if [ "$update_docs" = 1 ]; then
  results="$repo/docs/emulation-results.md"
  grep -q '<!-- emulation:begin' "$results" || printf '\n<!-- emulation:begin -->\n<!-- emulation:end -->\n' >>"$results"
  awk -v f="$section" '
    /<!-- emulation:begin/ { while ((getline line < f) > 0) print line; skip = 1; next }
    /<!-- emulation:end/ { skip = 0; next }
    !skip' "$results" >"$results.tmp" && mv "$results.tmp" "$results"
  echo "updated $results"
fi
