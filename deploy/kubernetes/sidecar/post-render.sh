#!/usr/bin/env bash
# Helm post-renderer: reads the rendered chart on stdin, writes it back with the tc-server sidecar added.
# Works on a copy of this directory and of ../alerts (which it includes) so that nothing is left behind.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/sidecar" "$work/alerts"
cp "$here"/*.yaml "$work/sidecar/"
cp "$here"/../alerts/*.yaml "$work/alerts/"
cat > "$work/sidecar/pulsar.yaml"
kubectl kustomize "$work/sidecar"
