#!/usr/bin/env bash
# The virtual environment at $1, for the Makefile: made afresh (a venv left without pip by a
# failed attempt is replaced); where Python cannot make one, Debian's python3-venv is installed
# first, then it is made again.
set -euo pipefail
SCRIPT_NAME=venv.sh
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"

venv=$1
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "Python 3.11 or newer is needed as python3"
if ! python3 -m venv --clear "$venv" >/dev/null 2>&1; then
    log "installing python3-venv (without it Python's venv cannot give the environment pip)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv --clear "$venv"
fi
