#!/bin/sh
# The command of every shard pod (deploy/kubernetes/statefulset.yaml): works out which shard
# this pod is, gives the server a private copy of the keystore, then becomes the server.
#
# - The shard index is the pod's ordinal, the number after the last '-' of its name
#   (edgetrain-shard-2 is shard 2 of EDGETRAIN_SHARDS).
# - The server refuses a keystore that group or others may read (server/keystore.cc), and a
#   Secret volume cannot give a non-root user a file of mode 0600: without fsGroup the file
#   belongs to root, with fsGroup the kubelet adds group read (kubernetes/kubernetes#57923).
#   So the Secret's file is copied to EDGETRAIN_KEYSTORE (mode 0600, an emptyDir) before the
#   server starts, and again whenever the Secret changes: the server re-reads its keystore
#   when the file's modification time changes, so an added or rolled key takes effect
#   without a restart (the kubelet refreshes a mounted Secret within about a minute).
# - exec: the server is the container's main process and gets the kubelet's SIGTERM itself.
#
# Environment (set by the StatefulSet): EDGETRAIN_SHARDS, EDGETRAIN_KEYSTORE_SECRET (the
# file in the Secret's volume), EDGETRAIN_KEYSTORE (the private copy, the server's
# --keystore). Arguments: the rest of edgetrain-server's flags.
set -eu

fail() { echo "shard-entrypoint: $*" >&2; exit 2; }

pod_name="${HOSTNAME:-$(cat /proc/sys/kernel/hostname)}"  # a StatefulSet pod's host name is its name
shard_index="${pod_name##*-}"
case "$shard_index" in
  '' | *[!0-9]*) fail "cannot tell the shard index from the pod name '$pod_name' (expected NAME-ORDINAL)" ;;
esac
case "$EDGETRAIN_SHARDS" in
  '' | *[!0-9]*) fail "EDGETRAIN_SHARDS must be the number of shards, not '$EDGETRAIN_SHARDS'" ;;
esac
[ "$shard_index" -lt "$EDGETRAIN_SHARDS" ] ||
  fail "pod $pod_name is shard $shard_index but EDGETRAIN_SHARDS is $EDGETRAIN_SHARDS: the StatefulSet's replicas and EDGETRAIN_SHARDS differ"

copy_keystore() {
  install -m 0600 "$EDGETRAIN_KEYSTORE_SECRET" "$EDGETRAIN_KEYSTORE.new" &&
    mv -f "$EDGETRAIN_KEYSTORE.new" "$EDGETRAIN_KEYSTORE"  # atomic: the server never reads half a file
}
copy_keystore || fail "cannot copy the keystore $EDGETRAIN_KEYSTORE_SECRET to $EDGETRAIN_KEYSTORE"
(
  while sleep "${EDGETRAIN_KEYSTORE_POLL_SECONDS:-10}"; do
    cmp -s "$EDGETRAIN_KEYSTORE_SECRET" "$EDGETRAIN_KEYSTORE" || copy_keystore || true
  done
) &

exec edgetrain-server --shard "$shard_index/$EDGETRAIN_SHARDS" "$@"
