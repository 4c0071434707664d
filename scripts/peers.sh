#!/usr/bin/env bash
# Build a peer tool's own virtual environment under .venv-peers/<name> (idempotent).
#   scripts/peers.sh optimum     optimum-onnx (pins transformers 4.57: kept out of .venv)
# torch is pinned by constraints.txt (the CPU wheel on disk; unpinned, pip pulls a CUDA build).
# A stamp file marks a finished build; a half-built venv (no stamp) is rebuilt from scratch.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
name=${1:?usage: scripts/peers.sh optimum}
case "$name" in
  optimum) pkgs=("optimum-onnx[onnxruntime]") ;;
  *) echo "scripts/peers.sh: unknown peer '$name'; expected optimum" >&2; exit 2 ;;
esac
venv="$ROOT/.venv-peers/$name"
stamp="$venv/.built"
[ -f "$stamp" ] && exit 0
rm -rf "$venv"
mkdir -p "$ROOT/.venv-peers"
start=$(date +%s)
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q -c "$ROOT/constraints.txt" "${pkgs[@]}"
echo "peer $name built in $(( $(date +%s) - start )) s" | tee "$stamp"
