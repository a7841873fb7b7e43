#!/usr/bin/env bash
# The X.509 identities of a fleet, with the openssl CLI (Debian package openssl): one CA and a
# certificate per device, EC P-256. A device's certificate CN is its identity: a gossip
# peer's name in the topology file (worker/README.md "Gossip"), or a worker's name at a
# server run with --cert. The CA is made once and kept: run it again with new names to add
# boards to the same fleet (existing certificates are left as they are).
#   DIR/CA.crt, CA.key        the fleet's CA (CA: --ca, default "ca")
#   DIR/NAME.crt, NAME.key    CN=NAME, signed by it, for every NAME; FILE=CN names the files FILE
# Keys are unencrypted PEM, mode 600: copy each board its own key, certificate and CA.crt.
# usage: fleet-certificates.sh [--days N] [--ca BASENAME] [--ca-cn CN] DIR NAME|FILE=CN...
set -euo pipefail
days=825 ca=ca ca_cn=edgetrain-fleet-ca
while [ $# -gt 0 ]; do
  case "$1" in
    --days) days="$2"; shift 2 ;;
    --ca) ca="$2"; shift 2 ;;
    --ca-cn) ca_cn="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fleet-certificates: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "usage: fleet-certificates.sh [--days N] [--ca BASENAME] [--ca-cn CN] DIR NAME|FILE=CN..." >&2; exit 2; }
command -v openssl >/dev/null || { echo "fleet-certificates: the openssl CLI is not installed (apt-get install openssl)" >&2; exit 2; }
dir="$1"; shift
mkdir -p "$dir"
cd "$dir"

# quietly COMMAND...: openssl's progress output hidden, shown with the command if it fails.
quietly() {
  "$@" 2>openssl.log || { echo "fleet-certificates: failed: $*" >&2; cat openssl.log >&2; exit 1; }
}

if [ ! -f "$ca.crt" ] || [ ! -f "$ca.key" ]; then
  quietly openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$ca.key" -out "$ca.crt" \
    -subj "/CN=$ca_cn" -days "$days" -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
fi
for entry in "$@"; do
  file="${entry%%=*}" cn="${entry#*=}"
  [ ! -f "$file.crt" ] || continue
  quietly openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$file.key" -out "$file.csr" \
    -subj "/CN=$cn"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n' >"$file.ext"
  quietly openssl x509 -req -in "$file.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial -out "$file.crt" \
    -days "$days" -extfile "$file.ext"
  rm -f "$file.csr" "$file.ext"
done
rm -f openssl.log
chmod 600 ./*.key
