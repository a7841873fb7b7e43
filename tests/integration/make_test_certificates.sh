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
fleet="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../boards" && pwd)/fleet-certificates.sh"
dir="$1"; shift
mkdir -p "$dir"
cd "$dir"
command -v openssl >/dev/null || { echo "make_test_certificates: openssl not installed" >&2; exit 77; }

# The fleet's own tool (boards/fleet-certificates.sh) makes them, valid for two days.
bash "$fleet" --days 2 --ca ca --ca-cn edgetrain-test-ca . server=edgetrain-server "$@"
bash "$fleet" --days 2 --ca other-ca --ca-cn unrelated-ca . stranger
