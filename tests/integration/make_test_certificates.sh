#!/usr/bin/env bash
# Throwaway X.509 material for the certificate tests, made at test time with the openssl
# CLI (package openssl): EC P-256 keys, valid for two days.
#   DIR/ca.crt, ca.key                     the test CA
#   DIR/server.crt, server.key             CN=edgetrain-server, signed by the CA
#   DIR/NAME.crt, NAME.key                 CN=NAME, signed by the CA, for every NAME given
#   DIR/other-ca.crt, other-ca.key         a second, unrelated CA
#   DIR/stranger.crt, stranger.key         CN=stranger, signed by the other CA
# usage: make_test_certificates.sh DIR [NAME...]
# Exit status 77 only when the openssl CLI is not installed (the tests skip then); any
# other failure is an error with openssl's own message.
set -euo pipefail
dir="$1"; shift
mkdir -p "$dir"
cd "$dir"
command -v openssl >/dev/null || { echo "make_test_certificates: openssl not installed" >&2; exit 77; }

# quietly COMMAND...: openssl's progress output hidden, shown with the command if it fails.
quietly() {
  "$@" 2>openssl.log || { echo "make_test_certificates: failed: $*" >&2; cat openssl.log >&2; exit 1; }
}

new_ca() {  # new_ca BASENAME CN
  quietly openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -out "$1.crt" \
    -subj "/CN=$2" -days 2 -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
}
new_leaf() {  # new_leaf BASENAME CN CA_BASENAME
  quietly openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -out "$1.csr" \
    -subj "/CN=$2"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n' >"$1.ext"
  quietly openssl x509 -req -in "$1.csr" -CA "$3.crt" -CAkey "$3.key" -CAcreateserial -out "$1.crt" -days 2 \
    -extfile "$1.ext"
  rm -f "$1.csr" "$1.ext"
}

new_ca ca edgetrain-test-ca
new_leaf server edgetrain-server ca
for name in "$@"; do new_leaf "$name" "$name" ca; done
new_ca other-ca unrelated-ca
new_leaf stranger stranger other-ca
rm -f openssl.log
chmod 600 ./*.key
