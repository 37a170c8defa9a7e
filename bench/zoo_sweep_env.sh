#!/usr/bin/env bash
# The conformance sweep's own environment (bench/zoo_sweep.py): torchvision's wheels import only with torch's
# CUDA build (which also runs on CPU), so the sweep does not use the project's CPU-torch venv.
#   bash bench/zoo_sweep_env.sh [VENV]     (default /work/venvs/sweep)
set -euo pipefail
VENV=${1:-/work/venvs/sweep}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH=${TORCH_VERSION:-2.13.0}
TORCHVISION=${TORCHVISION_VERSION:-0.28.0}
python3 -m venv "$VENV"
# --isolated: a find-links folder or constraints file configured for this machine (a CPU torch wheel) must not
# win over PyPI's CUDA build, the one torchvision's wheel links against
PIP=("$VENV/bin/pip" install --isolated --progress-bar off ${PIP_CERT:+--cert "$PIP_CERT"})
"${PIP[@]}" "torch==$TORCH" "torchvision==$TORCHVISION"
CONSTRAINTS=$(mktemp)
printf 'torch==%s\ntorchvision==%s\n' "$TORCH" "$TORCHVISION" > "$CONSTRAINTS"
"${PIP[@]}" -c "$CONSTRAINTS" timm transformers diffusers ultralytics pytest pytest-timeout
"${PIP[@]}" -c "$CONSTRAINTS" -e "$ROOT"
rm -f "$CONSTRAINTS"
"$VENV/bin/python" -c "import torch, torchvision, timm, transformers, diffusers, ultralytics; print('sweep env:', \
torch.__version__, torchvision.__version__, timm.__version__, transformers.__version__, diffusers.__version__, \
ultralytics.__version__)"
