#!/usr/bin/env bash
# Install tc-server and its runtime dependencies (no dev or audit extras) into a fresh virtualenv.
#
#   deploy/install.sh PREFIX [SOURCE_DIR]
#
# The container image's builder stage runs exactly this, and so does `make image-check`, so what is
# tested outside Docker is what ships. SOURCE_DIR defaults to the directory above this script; it needs
# pyproject.toml and tc_server/ (the files .dockerignore lets into the build context).
# PYTHON picks the interpreter (default python3); tc-server needs 3.11 (pyproject requires-python).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || "$1" == -* ]]; then
    echo "usage: $0 PREFIX [SOURCE_DIR]" >&2
    exit 2
fi
prefix=$1
src=${2:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"}
python=${PYTHON:-python3}

if [[ -e "$prefix/bin/python" ]]; then
    echo "error: $prefix already holds a virtualenv; install.sh only fills a fresh one" >&2
    exit 1
fi
[[ -f "$src/pyproject.toml" ]] || { echo "error: $src/pyproject.toml not found" >&2; exit 1; }

"$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || {
    echo "error: $python is $("$python" -V 2>&1); tc-server needs Python 3.11" >&2
    exit 1
}

"$python" -m venv "$prefix"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_NO_INPUT=1
"$prefix/bin/python" -m pip install --quiet --upgrade pip
# A regular (non-editable) install: the venv must not point back into the source tree, because the
# final image stage copies the venv alone. Runtime dependencies only: no [dev], no [audit].
"$prefix/bin/python" -m pip install --quiet "$src"
"$prefix/bin/python" -m pip check
"$prefix/bin/tc-server" --help >/dev/null
echo "tc-server installed in $prefix"
