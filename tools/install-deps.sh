#!/bin/sh
# Install the Debian packages strata needs to build and test, if missing.
# Idempotent and quick when everything is present (one dpkg-query).
#   build:  gcc make libpcre2-dev liburing-dev libcjson-dev libmicrohttpd-dev
#   tests:  python3-numpy python3-regex (the float64 oracle, tokenizer goldens),
#           clang (the clang build check and `make fuzz`)
set -e
PKGS="gcc make libpcre2-dev liburing-dev libcjson-dev libmicrohttpd-dev python3 python3-numpy python3-regex clang"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0
echo "installing Debian packages:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
