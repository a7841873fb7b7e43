#!/usr/bin/env bash
# The cost of secure aggregation per device against plain rounds (issue 39, part 2), on real
# processes: edgetrain-server --mode rounds and N edgetrain-workers over DTLS on loopback, once
# with plain dense deltas (--compressor none) and once with --secure-aggregation, the same
# model, data, clip norm and local steps, R rounds each (the server stops itself after R
# closes: --stop-after-updates; the workers give up 3 s after it is gone). In the secure run a share F of the devices leaves right after
# its masked input in round 0 (--test-secagg-drop-after input), and round 0's model is checked
# against the plain mean of every device's clipped delta (tests/integration/
# secagg_round_check.py). Prints a markdown table, per device that stayed and per round: bytes
# sent and received (the workers' stats files), messages (pulls, and the delta or every
# answered /round/secagg/ request but its 5.03 "not yet"s, counted apart; the GET /round
# polls, the same in both, are left out), CPU seconds (user + system, from /usr/bin/time,
# training and the give-up wait included); and the server's CPU per round; writes it with the
# command to OUT/secagg-cost.md. Rounds after round 0 wait --deadline seconds in their keys
# step for the devices that left (seen, selected, gone), which the wall time shows.
# Compression (issue 39 part 2): the runs named by --modes, of
#   plain           dense plain deltas (--compressor none)
#   plain-adacomp   plain rounds with the compression they have: AdaComp's per-tensor top-k at
#                   --rate F with error feedback (each device its own entries)
#   secure          dense secure aggregation
#   secure-subset   secure aggregation of a shared seeded random subset, --secagg-subset F,
#                   the rest kept on the device (error feedback)
#   secure-signed   dense secure aggregation against an active server: certificate identities
#                   (the fleet's tool, boards/fleet-certificates.sh, via tests/integration/
#                   make_test_certificates.sh; needs openssl) and --secagg-signed-keys, so each
#                   device signs its keys and the survivor list and checks everyone's
#   secure-neighbours  SecAgg+: dense secure aggregation with --secagg-neighbours K (--neighbours,
#                   12) and --secagg-threshold 0.51, the smallest majority of a neighbourhood's
#                   K + 1 holders (with 20 devices, K = 12 and 6 leaving, every neighbourhood
#                   keeps t = 7 of them, whichever graph is drawn)
#   secure-skellam  dense secure aggregation with the devices' discrete noise (--dp-noise
#                   skellam; needs --noise)
#   secure-adaptive dense secure aggregation with adaptive clipping (--dp-adaptive-clip-quantile
#                   0.5, the count in the masked vector; needs --noise)
# with F = --subset (0.1); each row also gives the test accuracy of the model after the
# rounds (edgetrain-server evaluate on --eval-data). Devices leave (--drop-fraction) in the
# secure runs only: give --drop-fraction 0 to compare accuracies. Round 0's model check
# covers the dense secure runs (the subset's sum: tests/unit/secure_round_test.cc).
# With --noise Z > 0 every run is DP-FedAvg (--aggregation dp-fedavg, z = Z, m = N): plain runs
# with the server's central noise, secure runs with the devices' distributed noise (each its
# share z·S/√N: --min-clients N is the count it is calibrated to); no device may leave then.
#
# usage: experiments/secagg-cost.sh [--build DIR] [--out DIR] [--devices N] [--drop-fraction F]
#                                   [--rounds R] [--model M] [--local-steps K] [--deadline S]
#                                   [--modes "plain secure ..."] [--subset F] [--eval-data D] [--noise Z]
#                                   [--neighbours K]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build/host" out=secagg-cost devices=20 drop_fraction=0.3 rounds=3 model=mlp local_steps=2 deadline=5
modes="plain plain-adacomp secure secure-subset" subset=0.1 eval_data=mnist-small noise=0 neighbours=12
die() { echo "secagg-cost.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --devices) devices=${2:?}; shift ;;
    --drop-fraction) drop_fraction=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --model) model=${2:?}; shift ;;
    --local-steps) local_steps=${2:?}; shift ;;
    --deadline) deadline=${2:?}; shift ;;
    --modes) modes=${2:?}; shift ;;
    --subset) subset=${2:?}; shift ;;
    --eval-data) eval_data=${2:?}; shift ;;
    --noise) noise=${2:?}; shift ;;
    --neighbours) neighbours=${2:?}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
server="$build/programs/edgetrain-server" worker="$build/programs/edgetrain-worker"
[ -x "$server" ] && [ -x "$worker" ] || die "no $server or $worker: ./build.sh build host -- edgetrain-server edgetrain-worker"
[ -x /usr/bin/time ] || die "/usr/bin/time is needed (apt-get install time)"
command -v jq >/dev/null || die "jq is needed (apt-get install jq)"
[[ "$devices" =~ ^[0-9]+$ ]] && [ "$devices" -ge 3 ] && [ "$devices" -le 255 ] || die "--devices: 3..255, not '$devices'"
dropped=$(python3 -c "import sys; print(int(float(sys.argv[1]) * int(sys.argv[2])))" "$drop_fraction" "$devices")
for mode in $modes; do
  case "$mode" in plain|plain-adacomp|secure|secure-subset|secure-signed|secure-neighbours|secure-skellam|secure-adaptive) ;; *) die "--modes: plain, plain-adacomp, secure, secure-subset, secure-signed, secure-neighbours, secure-skellam or secure-adaptive, not '$mode'" ;; esac
done
python3 -c "import sys; f = float(sys.argv[1]); sys.exit(0 if 0 < f <= 1 else 1)" "$subset" 2>/dev/null ||
  die "--subset: a fraction in (0, 1], not '$subset'"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0 else 1)" "$noise" 2>/dev/null || die "--noise: a noise multiplier >= 0, not '$noise'"
[[ "$neighbours" =~ ^[0-9]+$ ]] && [ $((neighbours % 2)) = 0 ] && [ "$neighbours" -ge 2 ] ||
  die "--neighbours: an even number of at least 2, not '$neighbours'"
[ "$noise" = 0 ] || [ "$dropped" = 0 ] || die "--noise needs --drop-fraction 0: rounds calibrated to $devices devices cannot close with fewer"
[ $((devices - dropped)) -gt $((devices / 2)) ] || die "--drop-fraction $drop_fraction leaves no majority of $devices devices"
source "$repo/common/processes.sh"
mkdir -p "$out"
work=$(mktemp -d)
trap 'stop_started_programs; rm -rf "$work"' EXIT
# Runs a program under /usr/bin/time, its user and system seconds to the file named first.
cat >"$work/timed" <<'EOF'
#!/bin/sh
cpu=$1; shift
exec /usr/bin/time -f "%U %S" -o "$cpu" "$@"
EOF
chmod +x "$work/timed"

rows=()
for mode in $modes; do
  run="$work/$mode"
  mkdir -p "$run/dump"
  printf '#!/bin/sh\nexec "%s" "%s" "%s" "$@"\n' "$work/timed" "$run/server.cpu" "$server" >"$run/server"
  chmod +x "$run/server"
  names=()
  for i in $(seq 1 "$devices"); do
    names+=("d$(printf %03d "$i")")
    add_device "$server" "$run/keys.toml" "${names[-1]}" "$run/${names[-1]}.toml"
  done
  args=(--state-dir "$run/state" --keystore "$run/keys.toml" --model "$model" --lr 0.05 --mode rounds
        --round-deadline "$deadline" --min-clients "$devices" --local-steps "$local_steps" --round-clip-norm 1
        --stop-after-updates "$rounds")
  case "$mode" in
    secure) args+=(--secure-aggregation) ;;
    secure-subset) args+=(--secure-aggregation --secagg-subset "$subset") ;;
    secure-signed)
      bash "$repo/tests/integration/make_test_certificates.sh" "$run/certs" "${names[@]}" >/dev/null ||
        die "could not make the test certificates (openssl)"
      args+=(--secure-aggregation --secagg-signed-keys --cert "$run/certs/server.crt" --cert-key "$run/certs/server.key"
             --ca "$run/certs/ca.crt") ;;
    secure-neighbours) args+=(--secure-aggregation --secagg-neighbours "$neighbours" --secagg-threshold 0.51) ;;
    secure-skellam) args+=(--secure-aggregation --dp-noise skellam) ;;
    secure-adaptive) args+=(--secure-aggregation --dp-adaptive-clip-quantile 0.5) ;;
  esac
  case "$mode" in secure-skellam|secure-adaptive) [ "$noise" != 0 ] || die "$mode needs --noise Z" ;; esac
  [ "$noise" = 0 ] || args+=(--aggregation dp-fedavg --dp-noise-multiplier "$noise" --dp-expected-devices "$devices")
  started=$SECONDS
  start_server "$run/server" "$run/server.log" --port 0 "${args[@]}"
  stayed=() worker_pids=()
  for i in "${!names[@]}"; do
    name=${names[$i]} extra=(--compressor none) secure=false
    [ "$mode" = plain-adacomp ] && extra=(--compressor adacomp --rate "$subset" --error-feedback)
    if [[ "$mode" = secure* ]]; then
      secure=true
      extra=(--test-secagg-dump "$run/dump")
      [ "$i" -lt $((devices - dropped)) ] || extra+=(--test-secagg-drop-after input)
    fi
    [ "$secure" = true ] && [ "$i" -ge $((devices - dropped)) ] || stayed+=("$name")
    identity=(--config "$run/$name.toml")
    [ "$mode" = secure-signed ] &&
      identity=(--cert "$run/certs/$name.crt" --cert-key "$run/certs/$name.key" --ca "$run/certs/ca.crt")
    start_worker "$run/$name.log" "$run/$name.stats.json" "$work/timed" "$run/$name.cpu" "$worker" \
      "${identity[@]}" --mode rounds --server "coaps://127.0.0.1:$server_port" --model "$model" \
      --data mnist-small --worker-id "$i" --workers "$devices" --lr 0.05 --quiet \
      --give-up-after 3 "${extra[@]}"
    worker_pids+=("$last_pid")
  done
  wait_for_exit "$server_pid" $((120 + rounds * deadline * 3)) >/dev/null || true
  wall=$((SECONDS - started))
  closed=$(json_get "$run/server.stats.json" rounds.rounds_closed)
  for pid in "${worker_pids[@]}"; do (wait_for_exit "$pid" 30 >/dev/null 2>&1) || true; done
  # Per device that stayed and per round the server closed.
  read -r sent received messages not_yet cpu < <(
    for name in "${stayed[@]}"; do
      s="$run/$name.stats.json"
      jq -r '[.bytes_sent, .bytes_received,
              (.pulls + (if .secagg_requests > 0 then .secagg_requests - .secagg_not_yet
                         else .rounds_trained + .deltas_refused + .deltas_rejected end)),
              .secagg_not_yet] | @tsv' "$s" |
        tr '\n' '\t'
      tail -1 "$run/$name.cpu" | awk '{print $1 + $2}'
    done | awk -v n="${#stayed[@]}" -v r="$closed" '{s += $1; g += $2; m += $3; y += $4; c += $5}
      END {d = n * r; printf "%.0f %.0f %.1f %.1f %.3f\n", s / d, g / d, m / d, y / d, c / d}')
  mkdir -p "$out/$mode" && cp "$run"/*.stats.json "$run"/*.cpu "$run"/*.log "$out/$mode/"  # the raw figures
  server_cpu=$(tail -1 "$run/server.cpu" | awk -v r="$closed" '{printf "%.3f", ($1 + $2) / r}')
  accuracy=$("$server" evaluate "$run/state/checkpoint.safetensors" --data "$eval_data" --json | jq -r '.accuracy * 10000 | round / 100')
  label=$mode
  case "$mode" in
    plain-adacomp) label="plain, AdaComp rate $subset" ;;
    secure-subset) label="secure, subset $subset" ;;
    secure-signed) label="secure, signed keys and consistency round (X.509)" ;;
    secure-neighbours) label="secure, $neighbours neighbours (SecAgg+)" ;;
    secure-skellam) label="secure, Skellam noise" ;;
    secure-adaptive) label="secure, adaptive clipping (last clip $(json_get "$run/server.stats.json" rounds.round_clip_norm | awk '{printf "%.3g", $1}'))" ;;
  esac
  if [ "$noise" != 0 ]; then
    case "$mode" in plain*) label="$label, dp-fedavg z = $noise (central)" ;; *) label="$label, dp-fedavg z = $noise (distributed, c = $devices)" ;; esac
    label="$label, ε $(json_get "$run/server.stats.json" rounds.dp_epsilon | awk '{printf "%.3g", $1}')"
  fi
  rows+=("| $label | $devices ($([[ "$mode" = secure* ]] && echo "$dropped left after their input in round 0" || echo "none left")) | $closed | $sent | $received | $messages (+ $not_yet not yet) | $cpu | $server_cpu | $wall | $accuracy% |")
  if { [ "$mode" = secure ] || [ "$mode" = secure-neighbours ]; } && [ "$dropped" -gt 0 ]; then  # the check needs devices that left
    gone=("${names[@]:$((devices - dropped))}")
    python3 "$repo/tests/integration/secagg_round_check.py" model "$run/dump" 0 1 "${names[@]}" -- "${gone[@]}" |
      tee "$run/check.txt" || die "round 0's model is not the mean of the devices' deltas"
  fi
done

table="$out/secagg-cost.md"
{
  echo "Command: experiments/secagg-cost.sh --devices $devices --drop-fraction $drop_fraction --rounds $rounds --model $model --local-steps $local_steps --deadline $deadline --modes \"$modes\" --subset $subset --eval-data $eval_data --noise $noise --neighbours $neighbours (commit $(git -C "$repo" rev-parse --short HEAD))"
  echo
  echo "| rounds | devices | rounds closed | bytes sent per device and round | bytes received | messages | device CPU s | server CPU s per round | wall s | test accuracy |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  [ ! -f "$work/secure/check.txt" ] || cat "$work/secure/check.txt"
  [ ! -f "$work/secure-neighbours/check.txt" ] || { printf 'secure-neighbours: '; cat "$work/secure-neighbours/check.txt"; }
} | tee "$table"
