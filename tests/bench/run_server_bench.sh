#!/usr/bin/env bash
# Server benchmark (issue 5): starts a real edgetrain-server on 127.0.0.1 with a fresh
# state directory on disk (so fdatasync costs what it costs), then runs edgetrain-loadgen:
#   1. load: many concurrent DTLS-PSK sessions posting paper-CNN AdaComp updates;
#   2. transfer: one update post and one model pull through a UDP relay adding 0, 10, 50 ms
#      each way, then sparse pulls (GET /model?since=V) after 3 and 10 updates by others.
# Prints each run's figures and a table at the end. Builds nothing: assumes build/host
# (cmake --preset host && cmake --build --preset host -j2). Prints figures; not a test.
#
# Settings (environment): EDGETRAIN_BUILD (build/host), BENCH_DEVICES (1000),
# BENCH_IN_FLIGHT (32), BENCH_SECONDS (30, posting time), BENCH_DELAYS ("0 10 50"),
# BENCH_PULL_BUDGET (40 s; a slower model pull is stopped and its time extrapolated from
# the blocks that arrived), BENCH_STATE_PARENT (the build tree; /dev/shm puts the WAL on
# tmpfs, where fdatasync costs nothing: not durable, only to see the ceiling without the
# per-update sync), BENCH_DELTA_AFTER ("3 10": updates between the version a sparse pull
# starts from and the current one), BENCH_RUNS ("load transfer": which runs),
# BENCH_COMPARE (server flags, e.g. "--datagrams-per-pass 1": the load run is then made
# BENCH_ROUNDS times (2) with those flags and with the defaults, alternating, and the table
# has a row per run), BENCH_BASELINE (another build tree, e.g. one of an earlier commit: the
# load run is then made BENCH_ROUNDS times with its edgetrain-server and with this build's,
# alternating, same flags, same load generator), BENCH_PIN ("S L": taskset CPU lists for the
# server and the load generator, e.g. "0 1", so that neither takes the other's core),
# BENCH_REPLAY (a WAL file, e.g. from tests/bench/record_updates.sh: the load runs post the
# updates real workers sent, `edgetrain-loadgen load --replay FILE`, instead of top-k of
# random gradients: same sizes, real index patterns), BENCH_SIGN_SCALE=1 (the load runs'
# values as sign + scale, --sign-scale: ~6 Block1 blocks per update instead of 22; with
# BENCH_REPLAY the recorded updates re-encoded so), BENCH_LOOP_THREADS (e.g. "1 2": the
# load run is made BENCH_ROUNDS times with each --loop-threads count, alternating, and a
# table puts them side by side), BENCH_Q_BLOCK=0 (the load generator posts with RFC 7959
# Block1, one exchange per block, as before Q-Block; the default 1 posts Q-Block1 bursts
# as the worker does), BENCH_SERVER_CPUS (e.g. "1.0": the server runs in a cgroup
# v1 cpu group with that many cores of CFS quota, its threads together; needs root),
# BENCH_SHARDS (N > 1: the server is N shard processes, `--shard I/N` on ports of their
# own, and the load generator drives them as workers do, `load --shard-ports`: every update
# cut into the shards' parts; each shard is pinned to its own CPU of BENCH_PIN's server list
# when the list has N CPUs, else all share it; each load run prints and checks that every
# shard made one version per update sent; the transfer runs need one server and are skipped).
# With BENCH_BASELINE, the baseline's shards are its edgetrain-server with the same --shard.
# Every run is bounded by `timeout`, none longer than 2 minutes (one more per extra shard).
set -euo pipefail

# BENCH_REPLAY as given, relative to the caller's directory, before the cd below.
replay_file=""
if [[ -n ${BENCH_REPLAY:-} ]]; then
  [[ -f $BENCH_REPLAY ]] || { echo "BENCH_REPLAY: no such file: $BENCH_REPLAY" >&2; exit 1; }
  replay_file=$(realpath -- "$BENCH_REPLAY")
fi
cd "$(dirname "$0")/../.."
source common/processes.sh
build=${EDGETRAIN_BUILD:-build/host}
devices=${BENCH_DEVICES:-1000}
in_flight=${BENCH_IN_FLIGHT:-32}
post_seconds=${BENCH_SECONDS:-30}
delays=${BENCH_DELAYS:-"0 10 50"}
pull_budget=${BENCH_PULL_BUDGET:-40}
delta_after=${BENCH_DELTA_AFTER:-"3 10"}
runs=${BENCH_RUNS:-"load transfer"}
# What the load runs post (edgetrain-loadgen load): synthetic or replayed, fp32 or sign + scale.
update_flags=()
[[ -z $replay_file ]] || update_flags+=(--replay "$replay_file")
case ${BENCH_SIGN_SCALE:-0} in
  0) ;;
  1) update_flags+=(--sign-scale) ;;
  *) echo "BENCH_SIGN_SCALE is 0 or 1, not '$BENCH_SIGN_SCALE'" >&2; exit 1 ;;
esac
case ${BENCH_Q_BLOCK:-1} in
  1) ;;
  0) update_flags+=(--q-block=false) ;;
  *) echo "BENCH_Q_BLOCK is 0 or 1, not '$BENCH_Q_BLOCK'" >&2; exit 1 ;;
esac

shards=${BENCH_SHARDS:-1}
[[ $shards =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_SHARDS is a number of shard servers >= 1, not '$shards'" >&2; exit 1; }

server=$build/programs/edgetrain-server
loadgen=$build/tests/edgetrain-loadgen
for program in "$server" "$loadgen"; do
  [[ -x $program ]] || { echo "missing $program: build the host preset first" >&2; exit 1; }
done

# One socket per client session in the load generator.
if (( $(ulimit -n) < devices + 256 )); then ulimit -n "$(ulimit -Hn)"; fi

# By default on the build tree's disk, not tmpfs: the WAL's fdatasync must reach a device.
work=$(mktemp -d "${BENCH_STATE_PARENT:-$PWD/$build}/server-bench.XXXXXX")
server_pid=""
shard_pids=() shard_ports=()
quota_group=""
cleanup() {
  local pid
  for pid in $server_pid ${shard_pids[@]+"${shard_pids[@]}"}; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
  [[ -z $quota_group ]] || rmdir "$quota_group" 2>/dev/null || true
}
trap cleanup EXIT

"$loadgen" keystore --out "$work/keys.toml" --devices "$devices"

# A fresh server (state removed), its port from its --port-file (common/processes.sh). All
# the load devices connect from 127.0.0.1: the per-address handshake limits are lifted to
# the global ones (transport/README.md, "Handshake floods").
pin_server="" pin_loadgen=()
if [[ -n ${BENCH_PIN:-} ]]; then
  read -r pin_server pin_l <<<"$BENCH_PIN"
  [[ -n $pin_server && -n $pin_l ]] || { echo "BENCH_PIN needs two CPU lists, \"SERVER LOADGEN\" (e.g. \"0 1\")" >&2; exit 1; }
  pin_loadgen=(taskset -c "$pin_l")
fi
baseline_server=""
if [[ -n ${BENCH_BASELINE:-} ]]; then
  baseline_server=$BENCH_BASELINE/programs/edgetrain-server
  # A build tree of a commit before programs/ holds the server in server/.
  [[ -x $baseline_server ]] || baseline_server=$BENCH_BASELINE/server/edgetrain-server
  [[ -x $baseline_server ]] || { echo "missing $baseline_server (BENCH_BASELINE is a build tree)" >&2; exit 1; }
fi
bench_server=$server  # which server binary start_bench_server runs
# BENCH_SERVER_CPUS: a cgroup v1 cpu group whose CFS quota is that many cores; the server
# (every thread: cgroup.procs moves the whole process) is put in it after its start.
if [[ -n ${BENCH_SERVER_CPUS:-} ]]; then
  cpu_root=$(dirname "$(ls /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us 2>/dev/null | head -n1)")
  [[ $cpu_root != . ]] || { echo "BENCH_SERVER_CPUS: no cgroup v1 cpu controller" >&2; exit 1; }
  quota_group=$cpu_root/edgetrain-server-bench-$$
  mkdir "$quota_group"
  echo 100000 > "$quota_group/cpu.cfs_period_us"
  awk -v c="$BENCH_SERVER_CPUS" 'BEGIN { printf "%d\n", c * 100000 }' > "$quota_group/cpu.cfs_quota_us"
fi

# BENCH_SHARDS: the CPUs of BENCH_PIN's server list one by one ("0-1,3" → 0 1 3).
pin_cpus=()
if [[ -n $pin_server ]]; then
  IFS=, read -r -a pin_parts <<<"$pin_server"
  for part in "${pin_parts[@]}"; do
    if [[ $part == *-* ]]; then pin_cpus+=($(seq "${part%-*}" "${part#*-}")); else pin_cpus+=("$part"); fi
  done
fi

start_one_server() {  # label, server flags... (sets server_pid, server_port, server_stats)
  local label=$1; shift
  rm -rf "$work/state$label" "$work/server$label.log"
  start_server "$bench_server" "$work/server$label.log" --port 0 --state-dir "$work/state$label" --keystore "$work/keys.toml" \
    --eval-data none --max-pending-handshakes-per-address 100 --handshake-rate-per-address 100000 "$@"
  if [[ -n $quota_group ]]; then echo "$server_pid" > "$quota_group/cgroup.procs"; fi
}

# One server, or BENCH_SHARDS shard servers (shard_ports, shard_pids; their stats files
# server-I.stats.json).
start_bench_server() {
  if (( shards == 1 )); then
    start_one_server "" "$@"
    port=$server_port
    # Every thread of the server, those it has started included (the ones it starts later inherit it).
    if [[ -n $pin_server ]]; then taskset -a -cp "$pin_server" "$server_pid" >/dev/null; fi
    return
  fi
  shard_pids=() shard_ports=()
  local i
  for ((i = 0; i < shards; i++)); do
    start_one_server "-$i" --model paper-cnn --shard "$i/$shards" "$@"
    shard_pids+=("$server_pid") shard_ports+=("$server_port")
    if (( ${#pin_cpus[@]} >= shards )); then
      taskset -a -cp "${pin_cpus[$i]}" "$server_pid" >/dev/null
    elif [[ -n $pin_server ]]; then
      taskset -a -cp "$pin_server" "$server_pid" >/dev/null
    fi
  done
  server_pid=""
}

stop_server() {
  local pid
  for pid in $server_pid ${shard_pids[@]+"${shard_pids[@]}"}; do
    kill -TERM "$pid"
    wait "$pid" || true
  done
  server_pid="" shard_pids=()
}

[[ -z $baseline_server ]] || echo "baseline: $baseline_server"
if (( shards > 1 )); then
  if (( ${#pin_cpus[@]} >= shards )); then where="shard I on CPU ${pin_cpus[*]} (in order)"
  elif [[ -n $pin_server ]]; then where="all on CPUs $pin_server (fewer CPUs than shards)"
  else where="unpinned"; fi
  echo "sharded server: $shards shard processes, $where"
fi
echo "server state on $(stat -f -c %T "$work"), $(nproc) cores, $(uname -r)"
: > "$work/load.txt"
compare=${BENCH_COMPARE:-}
rounds=${BENCH_ROUNDS:-2}
load_run() {  # label, server flags...
  local label=$1; shift
  echo "== load run: $label"
  start_bench_server "$@"
  local target stats_file=$work/server.stats.json
  if (( shards == 1 )); then
    target=(--port "$port" --server-pid "$server_pid")
  else
    target=(--shard-ports "${shard_ports[@]}" --shard-pids "${shard_pids[@]}")
    stats_file=$work/server-0.stats.json
  fi
  # The load generator's handshakes may take 60 s per server (its default budget).
  timeout $((120 + 60 * (shards - 1))) "${pin_loadgen[@]}" "$loadgen" load "${target[@]}" --keystore "$work/keys.toml" --devices "$devices" \
    --posts-in-flight "$in_flight" --seconds "$post_seconds" ${update_flags[@]+"${update_flags[@]}"} \
    | tee "$work/load.out" > /dev/null
  cat "$work/load.out"
  stop_server
  # Sharded: every update makes a version on every shard (an empty part too), so each
  # shard's final version (its stats file, a fresh state directory) must equal the updates
  # sent when no part was refused or unanswered, and the parts it acknowledged in any case.
  local check=""
  if (( shards > 1 )); then
    local summary_line sent acknowledged i version ok=1 expected
    summary_line=$(grep '^summary load' "$work/load.out" || true)
    sent=$(grep -o ' sent=[0-9]*' <<<"$summary_line" | cut -d= -f2)
    IFS=/ read -r -a acknowledged <<<"$(grep -o ' shard_acknowledged=[0-9/]*' <<<"$summary_line" | cut -d= -f2)"
    for ((i = 0; i < shards; i++)); do
      version=$(json_get "$work/server-$i.stats.json" version 2>/dev/null || echo missing)
      expected=${acknowledged[$i]:-?}
      if [[ $version == "$sent" && $version == "$expected" ]]; then
        echo "check: shard $i/$shards made $version versions = $sent updates sent: ok"
      elif [[ $version == "$expected" ]]; then
        echo "check: shard $i/$shards made $version versions = the $expected parts it acknowledged, of $sent updates sent (the others refused or unanswered): ok"
      else
        echo "check: shard $i/$shards made $version versions, but acknowledged $expected parts of $sent updates sent: MISMATCH"
        ok=0
      fi
    done
    check=" shard_check=$( ((ok)) && echo ok || echo MISMATCH)"
  fi
  # From the stopped server's stats file: requests per event loop (how the sessions spread)
  # and the time the loops held the handlers' mutex per applied update (the serial part).
  local spread
  spread=$(python3 -c 'import json,sys
j = json.load(open(sys.argv[1])); loops = j.get("loops", [])
held = sum(l.get("lock_held_seconds", 0) for l in loops); n = max(1, j.get("updates_applied", 0))
print("loop_requests=" + ("/".join(str(l["requests"]) for l in loops) or "-") + " lock_held_us=%.0f" % (held * 1e6 / n))' \
    "$stats_file" 2>/dev/null || echo "loop_requests=- lock_held_us=-")
  # The machine's 1-minute load average at the end of the run: on a shared machine only runs
  # made under similar load compare.
  local loadavg
  loadavg=$(cut -d' ' -f1 /proc/loadavg)
  echo "load average (1 min) at the end of the run: $loadavg"
  sed "s|^summary load|summary load label=${label// /_} $spread$check loadavg=$loadavg|" "$work/load.out" | grep '^summary load' >> "$work/load.txt" || true
}
if [[ " $runs " == *" load "* ]]; then
  if [[ -n ${BENCH_LOOP_THREADS:-} ]]; then
    read -r -a compare_flags <<<"$compare"
    for round in $(seq "$rounds"); do
      for n in $BENCH_LOOP_THREADS; do
        load_run "$n loop threads (round $round)" --loop-threads "$n" ${compare_flags[@]+"${compare_flags[@]}"}
      done
    done
  elif [[ -n $baseline_server ]]; then
    read -r -a compare_flags <<<"$compare"
    for round in $(seq "$rounds"); do
      bench_server=$baseline_server
      load_run "baseline (round $round)" "${compare_flags[@]}"
      bench_server=$server
      load_run "this build (round $round)" "${compare_flags[@]}"
    done
  elif [[ -n $compare ]]; then
    read -r -a compare_flags <<<"$compare"
    for round in $(seq "$rounds"); do
      load_run "$compare (round $round)" "${compare_flags[@]}"
      load_run "defaults (round $round)"
    done
  else
    load_run defaults
  fi
fi

: > "$work/transfer.txt"
delta_args=()
for n in $delta_after; do delta_args+=(--delta-after "$n"); done
if (( shards > 1 )) && [[ " $runs " == *" transfer "* ]]; then
  echo "transfer runs skipped: they time one server's post and pull, not a sharded server's (BENCH_SHARDS=$shards)"
fi
for delay in $delays; do
  [[ " $runs " == *" transfer "* ]] && (( shards == 1 )) || break
  start_bench_server  # a fresh server each time: version 0, same model bytes
  timeout 115 "$loadgen" transfer --port "$port" --keystore "$work/keys.toml" --delay-ms "$delay" \
    --pull-budget "$pull_budget" "${delta_args[@]}" | tee -a "$work/transfer.txt" || { echo "transfer at $delay ms failed; server log:"; cat "$work/server.log"; }
  stop_server
done

# The table, from the loadgen's "summary" lines.
field() { grep -o "$1=[^ ]*" <<<"$2" | head -1 | cut -d= -f2; }
echo
echo "| figure | value | goal |"
echo "|---|---|---|"
while read -r load; do
[[ -n $load ]] || continue
label=$(field label "$load" | tr _ ' ')
[[ $label == defaults ]] || printf '| **server %s** | | |\n' "$label"
load_shards=$(field shards "$load"); load_shards=${load_shards:-1}
printf '| concurrent DTLS-PSK sessions established | %s of %s | ≥ 1,000 |\n' "$(field established "$load")" "$(( $(field devices "$load") * load_shards ))"
(( load_shards == 1 )) || printf '| devices posting (a session with every shard) | %s of %s | |\n' "$(field devices_posting "$load")" "$(field devices "$load")"
updates_label="synthetic top-k, c = 0.01"
[[ $(field source "$load") != replay ]] || updates_label="replayed: $(field records "$load") recorded updates"
printf '| durable updates applied per second (paper CNN, %s, %s values, %s B, %s in flight) | %.0f | ≥ 5,000 |\n' \
  "$updates_label" "$(field values "$load")" "$(field update_bytes "$load")" "$(field in_flight "$load")" \
  "$(field updates_per_s "$load")"
printf '| CPU per update: server / load generator (load average at the end) | %.0f / %.0f µs (%s) | |\n' "$(field server_cpu_us "$load")" \
  "$(field loadgen_cpu_us "$load")" "$(field loadavg "$load")"
if (( load_shards > 1 )); then
  printf '| %s shards: CPU per durable update per shard | %s µs (total above) | |\n' "$load_shards" "$(field shard_cpu_us "$load" | sed 's|/| / |g')"
  printf '| %s shards: versions made per shard, updates sent | %s; %s sent: %s | every update a version on every shard |\n' \
    "$load_shards" "$(field shard_versions "$load" | sed 's|/| / |g')" "$(field sent "$load")" "$(field shard_check "$load")"
fi
printf '| client→server datagram bytes over codec bytes | +%.1f %% | ≤ 10 %% |\n' "$(field overhead_pct "$load")"
printf '| server submit(): decode / WAL write+fdatasync / apply | %.0f / %.0f / %.0f µs | |\n' \
  "$(field decode_us "$load")" "$(field wal_append_fdatasync_us "$load")" "$(field apply_us "$load")"
done < <(grep '^summary load' "$work/load.txt" || true)
while read -r line; do
  printf '| one-way delay %s ms: one update post / one model pull | %.3f s / %.1f s (%s) | |\n' \
    "$(field delay_ms "$line")" "$(field update_s "$line")" "$(field pull_s "$line")" "$(field pull "$line")"
done < <(grep '^summary transfer' "$work/transfer.txt" || true)
while read -r line; do
  printf '| one-way delay %s ms: sparse pull after %s updates (GET /model?since=V) | %.3f s, %s B (dense %s B); %s datagrams, %s B to the server | |\n' \
    "$(field delay_ms "$line")" "$(field updates "$line")" "$(field pull_s "$line")" "$(field delta_bytes "$line")" \
    "$(field dense_bytes "$line")" "$(field pull_request_datagrams "$line")" "$(field pull_request_bytes "$line")"
done < <(grep '^summary delta' "$work/transfer.txt" || true)
while read -r line; do
  printf '| one-way delay %s ms: dense pull, to the server | %s datagrams, %s B | |\n' \
    "$(field delay_ms "$line")" "$(field pull_request_datagrams "$line")" "$(field pull_request_bytes "$line")"
done < <(grep '^summary transfer' "$work/transfer.txt" || true)

# BENCH_LOOP_THREADS: the load runs side by side, a column per loop-thread count, the
# rounds' figures in order. "Server cores busy": updates/s × CPU per update; "per server
# core": updates/s over the cores the server was allowed (BENCH_SERVER_CPUS, else the CPUs
# of BENCH_PIN's server list, else all).
if [[ -n ${BENCH_LOOP_THREADS:-} ]]; then
  allowed=${BENCH_SERVER_CPUS:-}
  if [[ -z $allowed && -n $pin_server ]]; then
    allowed=$(python3 -c 'import sys; print(sum(int(b)-int(a)+1 if "-" in p else 1 for p in sys.argv[1].split(",") for a,b in [ (p.split("-")+[p])[:2] ]))' "$pin_server")
  fi
  allowed=${allowed:-$(nproc)}
  echo
  echo "server allowed $allowed cores${BENCH_PIN:+, pinned \"$BENCH_PIN\" (server, load generator)}; $devices sessions, $in_flight in flight, $post_seconds s per run"
  header="| figure |" rule="|---|"
  for n in $BENCH_LOOP_THREADS; do header+=" $n loop thread(s) |"; rule+="---|"; done
  echo "$header"; echo "$rule"
  row() {  # title, awk expression over u (updates/s) and c (server CPU µs per update)
    local line="| $1 |" n
    for n in $BENCH_LOOP_THREADS; do
      line+=" $(grep "^summary load label=${n}_loop_threads_" "$work/load.txt" | while read -r load; do
        awk -v u="$(field updates_per_s "$load")" -v c="$(field server_cpu_us "$load")" -v a="$allowed" "BEGIN { printf \"%s\", $2 }"
        printf ' / '
      done | sed 's| / $||') |"
    done
    echo "$line"
  }
  row "durable updates/s" 'sprintf("%.0f", u)'
  row "server CPU per durable update (µs)" 'sprintf("%.0f", c)'
  row "server cores busy" 'sprintf("%.2f", u * c / 1e6)'
  line="| handlers' mutex held per durable update (µs; the serial part) |"
  for n in $BENCH_LOOP_THREADS; do
    line+=" $(grep "^summary load label=${n}_loop_threads_" "$work/load.txt" | while read -r load; do printf '%s / ' "$(field lock_held_us "$load")"; done | sed 's| / $||') |"
  done
  echo "$line"
  row "durable updates/s per allowed server core" 'sprintf("%.0f", u / a)'
  line="| requests per loop |"
  for n in $BENCH_LOOP_THREADS; do
    line+=" $(grep "^summary load label=${n}_loop_threads_" "$work/load.txt" | while read -r load; do printf '%s ; ' "$(field loop_requests "$load")"; done | sed 's| ; $||') |"
  done
  echo "$line"
fi
