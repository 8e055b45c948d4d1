#!/usr/bin/env bash
# Install tc-server and its runtime dependencies (no dev or audit extras) into a fresh virtualenv,
# at exactly the versions uv.lock pins, with uv at the version uv-requirements.txt pins (by hash).
#
#   deploy/install.sh PREFIX [SOURCE_DIR]
#
# The container image's builder stage runs exactly this, and so does `make image-check`, so what is
# tested outside Docker is what ships. SOURCE_DIR defaults to the directory above this script; it needs
# pyproject.toml, uv.lock, uv-requirements.txt and tc_server/ (the files .dockerignore lets into the
# build context).
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
for needed in pyproject.toml uv.lock uv-requirements.txt; do
    [[ -f "$src/$needed" ]] || { echo "error: $src/$needed not found" >&2; exit 1; }
done

"$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || {
    echo "error: $python is $("$python" -V 2>&1); tc-server needs Python 3.11" >&2
    exit 1
}

# uv itself goes into a throwaway venv: the installed venv holds tc-server's packages only (no pip).
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$python" -m venv "$tools/uv"
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_NO_INPUT=1 \
    "$tools/uv/bin/python" -m pip install --quiet --require-hashes -r "$src/uv-requirements.txt"
uv=$tools/uv/bin/uv

# --locked: refuse a uv.lock that no longer matches pyproject.toml. --no-editable: the venv must not
# point back into the source tree, because the final image stage copies the venv alone. No --extra:
# runtime dependencies only, no [dev], no [audit]. --compile-bytecode: the image runs with
# PYTHONDONTWRITEBYTECODE on a read-only root filesystem, so byte code is compiled here, once.
# UV_PYTHON_DOWNLOADS=never: use $python, never fetch a Python build.
UV_PROJECT_ENVIRONMENT="$prefix" UV_PYTHON_DOWNLOADS=never \
    "$uv" sync --quiet --locked --no-editable --compile-bytecode --project "$src" --python "$python"
"$uv" pip check --quiet --python "$prefix/bin/python"
"$prefix/bin/tc-server" --help >/dev/null
echo "tc-server installed in $prefix"
