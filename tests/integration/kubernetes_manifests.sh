#!/usr/bin/env bash
# deploy/kubernetes/ checked offline, with no cluster: kubectl 1.20 (Debian bookworm's
# kubernetes-client, which toolchains/setup-deps.sh unpacks into
# $EDGETRAIN_DEPS/kubernetes-client) renders the kustomization, decodes the StatefulSet and
# the Services into their v1 types, and jq checks what the shards need to work:
#  - the StatefulSet runs as many shards as the servers are told (EDGETRAIN_SHARDS), all at once;
#  - one UDP Service on port 5684 per shard, each selecting its own pod, reachable from
#    outside the cluster (LoadBalancer or NodePort);
#  - the state volume (volumeClaimTemplate) mounted at --state-dir;
#  - the keystore Secret mounted read-only where the entrypoint copies it from, the copy
#    where --keystore points, on a writable volume;
#  - the probes on the TCP port --metrics-listen opens, and /metrics;
#  - non-root, read-only root file system, a grace period for the clean stop, resources;
#  - the entrypoint itself (from the rendered ConfigMap, with a stand-in edgetrain-server):
#    --shard from the pod name, a private mode-0600 copy of the keystore refreshed when the
#    Secret changes, an ordinal beyond the shard count refused;
#  - deploy/OPERATIONS.md's worker example lists one address per shard.
# What kubectl 1.20 cannot check without a cluster (unknown fields, server-side defaults and
# admission): deploy/OPERATIONS.md, "What was run".
# usage: kubernetes_manifests.sh SOURCE_DIR [KUBECTL]  (KUBECTL in the environment wins)
source "$(dirname "$0")/process_test_lib.sh"
source_dir="$1"
manifests="${MANIFESTS:-$source_dir/deploy/kubernetes}"  # MANIFESTS: check another copy
kubectl="${KUBECTL:-${2:-${EDGETRAIN_DEPS:-/var/cache/edgetrain}/kubernetes-client/usr/bin/kubectl}}"
if [ ! -x "$kubectl" ]; then
  [ -z "${CI:-}" ] || fail "no kubectl at $kubectl under CI (toolchains/setup-deps.sh unpacks kubernetes-client)"
  echo "SKIP: no kubectl at $kubectl (toolchains/setup-deps.sh unpacks Debian's kubernetes-client there)"
  exit 77
fi
"$kubectl" version --client --short 2>/dev/null || "$kubectl" version --client
# No cluster: an empty configuration, so nothing can reach one by accident.
export KUBECONFIG=/dev/null

"$kubectl" kustomize "$manifests" >"$work/rendered.yaml" || fail "kubectl kustomize $manifests failed"
# Every object as JSON (--local: no server), one array.
"$kubectl" label --local -f "$work/rendered.yaml" edgetrain.checked=offline -o json >"$work/objects.stream" ||
  fail "kubectl could not read the rendered objects"
jq -s . "$work/objects.stream" >"$work/objects.json"
objects() { jq "$@" "$work/objects.json"; }
# The StatefulSet and the Services decoded into their v1 types: a wrong type (a string for a
# number, a list for a map) fails here. Unknown field names do not (kubectl 1.20 decodes leniently).
objects '.[] | select(.kind == "StatefulSet")' >"$work/statefulset.json"
objects '.[] | select(.kind == "Service")' >"$work/services.json"
"$kubectl" set image --local -f "$work/statefulset.json" 'server=typed-decode-check' -o name >/dev/null ||
  fail "the StatefulSet does not decode as apps/v1"
"$kubectl" set selector --local -f "$work/services.json" 'typed=decode-check' -o name >/dev/null ||
  fail "a Service does not decode as v1"

check() {  # check 'JQ FILTER that must be true' 'what it means' [jq args...]
  local filter="$1" meaning="$2"; shift 2
  [ "$(jq -r "$@" "$filter" "$work/statefulset.json")" = true ] || fail "$meaning"
}
[ "$(objects '[.[] | select(.kind == "StatefulSet")] | length')" = 1 ] || fail "expected exactly one StatefulSet"
statefulset=$(jq -r .metadata.name "$work/statefulset.json")
check '.spec.template.spec.containers | length == 1' "the shard pod should have one container, the server"
container='.spec.template.spec.containers[0]'
volumes='.spec.template.spec.volumes'
arg() {  # the value of edgetrain-server's --NAME=VALUE in the container's args
  jq -r --arg flag "--$1=" "$container.args[] | select(startswith(\$flag)) | ltrimstr(\$flag)" "$work/statefulset.json"
}
env_value() { jq -r --arg name "$1" "$container.env[] | select(.name == \$name) | .value" "$work/statefulset.json"; }
mount_of() {  # the volume mount whose path is $1, as JSON (empty when none)
  jq -c --arg path "$1" "$container.volumeMounts[] | select(.mountPath == \$path)" "$work/statefulset.json"
}

# The shard count: one number for the StatefulSet, the servers and the Services.
shards=$(objects -r '.[] | select(.kind == "ConfigMap" and (.metadata.name | startswith("edgetrain-shards"))) | .data.shards')
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || fail "the edgetrain-shards ConfigMap should hold the shard count, not '$shards'"
echo "shards: $shards"
check ".spec.replicas == $shards" "StatefulSet replicas $(jq .spec.replicas "$work/statefulset.json") differ from the shard count $shards the servers get"
check '.spec.podManagementPolicy == "Parallel"' "podManagementPolicy should be Parallel (the shards do not wait for each other)"
check "[$container.env[] | select(.name == \"EDGETRAIN_SHARDS\") | .valueFrom.configMapKeyRef] |
       length == 1 and .[0].key == \"shards\" and (.[0].name | startswith(\"edgetrain-shards\"))" \
  "EDGETRAIN_SHARDS should come from the edgetrain-shards ConfigMap"

# Per-shard Services: exactly one UDP 5684 Service per pod, reachable from outside.
dtls_port=$(arg port)
[ "$dtls_port" = 5684 ] || fail "the server should listen on the default DTLS port 5684, not '$dtls_port'"
per_shard='[.[] | select(.kind == "Service" and (.spec.selector // {} | has("statefulset.kubernetes.io/pod-name")))]'
[ "$(objects "$per_shard | length")" = "$shards" ] ||
  fail "expected $shards per-shard Services, found $(objects "$per_shard | length")"
expected_pods=$(seq 0 $((shards - 1)) | sed "s/^/$statefulset-/" | jq -Rsc 'split("\n") | map(select(. != "")) | sort')
[ "$(objects -c "$per_shard | map(.spec.selector[\"statefulset.kubernetes.io/pod-name\"]) | sort")" = "$expected_pods" ] ||
  fail "the per-shard Services should select the pods $expected_pods, one each"
[ "$(objects "$per_shard | map(select((.spec.selector | length) == 1)) | length")" = "$shards" ] ||
  fail "a per-shard Service should select by the pod name alone"
[ "$(objects "$per_shard | map(select(.spec.type == \"LoadBalancer\" or .spec.type == \"NodePort\")) | length")" = "$shards" ] ||
  fail "every per-shard Service should be of type LoadBalancer or NodePort (boards are outside the cluster)"
udp_port_of_container=$(jq -r "[$container.ports[] | select(.protocol == \"UDP\")] | .[0] | \"\(.name) \(.containerPort)\"" "$work/statefulset.json")
[ "${udp_port_of_container#* }" = "$dtls_port" ] || fail "the container's UDP port should be --port $dtls_port"
objects -e --arg name "${udp_port_of_container% *}" --argjson port "$dtls_port" "$per_shard | all(
    (.spec.ports | length == 1) and .spec.ports[0].protocol == \"UDP\" and .spec.ports[0].port == 5684 and
    (.spec.ports[0].targetPort == \$name or .spec.ports[0].targetPort == \$port))" >/dev/null ||
  fail "each per-shard Service should have one port: UDP 5684 to the container's DTLS port"
# The headless Service of the StatefulSet.
objects -e --arg name "$(jq -r .spec.serviceName "$work/statefulset.json")" --argjson labels \
    "$(jq -c .spec.template.metadata.labels "$work/statefulset.json")" \
  '[.[] | select(.kind == "Service" and .metadata.name == $name and .spec.clusterIP == "None"
         and (.spec.selector | to_entries | all($labels[.key] == .value)))] | length == 1' >/dev/null ||
  fail "the StatefulSet's serviceName should be a headless Service selecting its pods"

# The state directory on the volumeClaimTemplate.
state_dir=$(arg state-dir)
[ -n "$state_dir" ] || fail "no --state-dir in the server's args"
state_mount=$(mount_of "$state_dir")
[ -n "$state_mount" ] || fail "nothing is mounted at --state-dir $state_dir"
check "[.spec.volumeClaimTemplates[].metadata.name] | index(\"$(jq -r .name <<<"$state_mount")\") != null" \
  "the volume at --state-dir $state_dir should be a volumeClaimTemplate (the WAL must outlive the pod)"
[ "$(jq -r '.readOnly // false' <<<"$state_mount")" = false ] || fail "the state volume must be writable"

# The keystore: the Secret mounted read-only where the entrypoint copies it from; the copy,
# where --keystore points, on a writable emptyDir.
keystore=$(arg keystore)
[ "$keystore" = "$(env_value EDGETRAIN_KEYSTORE)" ] ||
  fail "--keystore ($keystore) and EDGETRAIN_KEYSTORE ($(env_value EDGETRAIN_KEYSTORE)) should name the same file"
secret_file=$(env_value EDGETRAIN_KEYSTORE_SECRET)
secret_mount=$(mount_of "$(dirname "$secret_file")")
[ -n "$secret_mount" ] || fail "nothing is mounted at $(dirname "$secret_file"), where the keystore Secret should be"
[ "$(jq -r '.readOnly // false' <<<"$secret_mount")" = true ] || fail "the keystore Secret should be mounted read-only"
secret_volume=$(jq -c --arg name "$(jq -r .name <<<"$secret_mount")" "$volumes[] | select(.name == \$name)" "$work/statefulset.json")
secret_name=$(jq -r '.secret.secretName // empty' <<<"$secret_volume")
[ -n "$secret_name" ] || fail "the volume at $(dirname "$secret_file") is not a Secret"
jq -e --arg file "$(basename "$secret_file")" '.secret.items == null or any(.secret.items[]; .path == $file and .key == $file)' \
  <<<"$secret_volume" >/dev/null || fail "the Secret should put its key $(basename "$secret_file") at $secret_file"
copy_volume_name=$(jq -r .name <<<"$(mount_of "$(dirname "$keystore")")")
jq -e --arg name "$copy_volume_name" "$volumes[] | select(.name == \$name) | has(\"emptyDir\")" "$work/statefulset.json" >/dev/null ||
  fail "the keystore's copy ($keystore) should be on an emptyDir"
# The Secret as OPERATIONS.md makes it holds that key.
printf '[devices]\n' >"$work/keys.toml"
"$kubectl" create secret generic "$secret_name" --from-file="$work/keys.toml" --dry-run=client -o json |
  jq -e --arg file "$(basename "$secret_file")" '.data | has($file)' >/dev/null ||
  fail "kubectl create secret generic $secret_name --from-file=keys.toml does not give the key the pod reads"
grep -q "kubectl -n edgetrain create secret generic $secret_name --from-file=keys.toml" "$source_dir/deploy/OPERATIONS.md" ||
  fail "deploy/OPERATIONS.md should show how to create the Secret $secret_name"

# Probes on the port --metrics-listen opens.
metrics_port=$(arg metrics-listen); metrics_port="${metrics_port##*:}"
[[ "$metrics_port" =~ ^[0-9]+$ ]] || fail "--metrics-listen should be ADDRESS:PORT"
for probe in startupProbe readinessProbe livenessProbe; do
  probe_port=$(jq -r "$container.$probe | (.httpGet // .tcpSocket).port // empty" "$work/statefulset.json")
  [ -n "$probe_port" ] || fail "the container has no $probe on a port"
  jq -e --arg port "$probe_port" "$container.ports | any(.protocol == \"TCP\" and .containerPort == $metrics_port and
      (.name == \$port or (.containerPort | tostring) == \$port))" "$work/statefulset.json" >/dev/null ||
    fail "$probe's port $probe_port is not the TCP port $metrics_port that --metrics-listen opens"
  path=$(jq -r "$container.$probe.httpGet.path // \"/metrics\"" "$work/statefulset.json")
  [ "$path" = /metrics ] || fail "$probe asks for $path; the metrics endpoint answers only /metrics"
done

# Running safely and stopping cleanly.
check '.spec.template.spec.securityContext.runAsNonRoot == true' "the pod should run as non-root"
check "$container.securityContext.readOnlyRootFilesystem == true" "the root file system should be read-only"
check '(.spec.template.spec.terminationGracePeriodSeconds // 30) >= 30' "give SIGTERM's checkpoint at least 30 s"
check "$container.resources | (.requests.cpu and .requests.memory and .limits.memory) != null" \
  "the server should have CPU and memory requests and a memory limit"

# The entrypoint, as the pod runs it: shard-entrypoint.sh from the rendered ConfigMap.
entrypoint=$(jq -r "$container.command[-1]" "$work/statefulset.json")
entrypoint_volume=$(jq -r .name <<<"$(mount_of "$(dirname "$entrypoint")")")
entrypoint_map=$(jq -r --arg name "$entrypoint_volume" "$volumes[] | select(.name == \$name) | .configMap.name" "$work/statefulset.json")
objects -r --arg name "$entrypoint_map" --arg file "$(basename "$entrypoint")" \
  '.[] | select(.kind == "ConfigMap" and .metadata.name == $name) | .data[$file] // empty' >"$work/entrypoint.sh"
[ -s "$work/entrypoint.sh" ] || fail "no ConfigMap gives the container its command $entrypoint"
mkdir -p "$work/bin" "$work/secret" "$work/run"
cat >"$work/bin/edgetrain-server" <<STUB
#!/bin/sh
# Stands in for the server: records its arguments, then waits to be told to stop (at most 20 s).
printf '%s\n' "\$@" >"$work/server-args.new" && mv "$work/server-args.new" "$work/server-args"
i=0; while [ ! -e "$work/stop" ] && [ \$i -lt 200 ]; do sleep 0.1; i=\$((i + 1)); done
STUB
chmod +x "$work/bin/edgetrain-server"
printf '[devices]\npi-01 = "%s"\n' 00112233445566778899aabbccddeeff >"$work/secret/keys.toml"
chmod 0440 "$work/secret/keys.toml"  # what the kubelet makes of defaultMode 0400 with fsGroup
entrypoint_pid=""
# The entrypoint leaves its keystore refresher running after the server (the stand-in) ends,
# as in a pod, where it ends with the container: end its process group here.
stop_entrypoint() { [ -z "$entrypoint_pid" ] || kill -TERM -- "-$entrypoint_pid" 2>/dev/null || true; }
trap 'stop_entrypoint; stop_started_programs; rm -rf "$work"' EXIT
run_entrypoint() {  # run_entrypoint HOSTNAME: the entrypoint in a session of its own
  HOSTNAME="$1" EDGETRAIN_SHARDS="$shards" EDGETRAIN_KEYSTORE_SECRET="$work/secret/keys.toml" \
    EDGETRAIN_KEYSTORE="$work/run/keys.toml" EDGETRAIN_KEYSTORE_POLL_SECONDS=1 PATH="$work/bin:$PATH" \
    setsid sh "$work/entrypoint.sh" --state-dir=/var/lib/edgetrain/state "--keystore=$work/run/keys.toml" \
    >"$work/entrypoint.log" 2>&1 &
  entrypoint_pid=$!
}
last=$((shards - 1))
run_entrypoint "$statefulset-$last"
wait_until() { local i; for i in $(seq 100); do eval "$1" && return 0; sleep 0.1; done; return 1; }
wait_until '[ -s "$work/server-args" ]' || { cat "$work/entrypoint.log" >&2; fail "the entrypoint did not start the server"; }
[ "$(head -2 "$work/server-args" | paste -sd' ')" = "--shard $last/$shards" ] ||
  fail "pod $statefulset-$last should start shard $last/$shards; the server got: $(paste -sd' ' "$work/server-args")"
grep -qx -- "--keystore=$work/run/keys.toml" "$work/server-args" || fail "the entrypoint should pass its arguments on"
[ "$(stat -c %a "$work/run/keys.toml")" = 600 ] || fail "the keystore's copy should have mode 0600 (the server refuses more)"
cmp -s "$work/secret/keys.toml" "$work/run/keys.toml" || fail "the keystore's copy differs from the Secret"
# A key added to the Secret reaches the copy (the kubelet swaps the Secret's files the same way).
chmod 0640 "$work/secret/keys.toml"
printf 'pi-02 = "%s"\n' ffeeddccbbaa99887766554433221100 >>"$work/secret/keys.toml"
wait_until 'cmp -s "$work/secret/keys.toml" "$work/run/keys.toml"' || fail "a changed Secret did not reach the keystore's copy"
[ "$(stat -c %a "$work/run/keys.toml")" = 600 ] || fail "the refreshed copy should have mode 0600"
touch "$work/stop"; wait "$entrypoint_pid" || fail "the entrypoint (the stand-in server) failed"
stop_entrypoint
rm -f "$work/stop" "$work/server-args"
run_entrypoint "$statefulset-$shards"
status=0; wait "$entrypoint_pid" || status=$?
stop_entrypoint
[ "$status" = 2 ] && grep -q "replicas and EDGETRAIN_SHARDS differ" "$work/entrypoint.log" ||
  fail "pod $statefulset-$shards (beyond $shards shards) should be refused with exit status 2, got $status: $(cat "$work/entrypoint.log")"

# The workers' example in OPERATIONS.md names one address per shard.
example=$(grep -o -- '--shards [^ ]*' "$source_dir/deploy/OPERATIONS.md" | head -1)
[ "$(tr ',' '\n' <<<"${example#--shards }" | grep -c '^coaps://')" = "$shards" ] ||
  fail "deploy/OPERATIONS.md's '--shards' example should list $shards addresses: $example"
echo "kubernetes manifests: all checks passed"
