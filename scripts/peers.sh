#!/usr/bin/env bash
# Build a peer tool's own virtual environment under .venv-peers/<name> (idempotent).
#   scripts/peers.sh optimum     optimum-onnx (pins transformers 4.57: kept out of .venv)
#   scripts/peers.sh genai       onnxruntime-genai 0.18 and what its model builder imports undeclared
#   scripts/peers.sh mobius      onnxruntime's mobius-onnx 0.1 (build with scripts/mobius_build.py)
# torch is pinned by constraints.txt (the CPU wheel on disk; unpinned, pip pulls a CUDA build).
# A stamp file marks a finished build; a half-built venv (no stamp) is rebuilt from scratch.
# SEQEXPORT_PEERS puts the venvs elsewhere (e.g. a copy of the tree using this one's).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
name=${1:?usage: scripts/peers.sh optimum|genai|mobius}
case "$name" in
  optimum) pkgs=("optimum-onnx[onnxruntime]==0.1.0") ;;
  genai) pkgs=(onnxruntime-genai==0.18.0 onnxruntime torch transformers==5.24.0 onnx onnx_ir) ;;
  mobius) pkgs=(mobius-onnx==0.1.0 torch transformers==5.24.0) ;;
  *) echo "scripts/peers.sh: unknown peer '$name'; expected optimum, genai or mobius" >&2; exit 2 ;;
esac
PEERS=${SEQEXPORT_PEERS:-$ROOT/.venv-peers}
venv="$PEERS/$name"
stamp="$venv/.built"
[ -f "$stamp" ] && exit 0
rm -rf "$venv"
mkdir -p "$PEERS"
start=$(date +%s)
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q -c "$ROOT/constraints.txt" "${pkgs[@]}"
echo "peer $name built in $(( $(date +%s) - start )) s" | tee "$stamp"
