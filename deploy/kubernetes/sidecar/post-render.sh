#!/usr/bin/env bash
# Helm post-renderer: reads the rendered chart on stdin, writes it back with the tc-server sidecar added.
# Works on a copy of this directory so that nothing is left behind.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here"/*.yaml "$work"/
cat > "$work/pulsar.yaml"
kubectl kustomize "$work"
