#!/usr/bin/env bash
# The TensorRT round trip in one command, on a machine with a GPU and TensorRT (trtexec on PATH):
# export the project's QDQ ONNX, build an engine from it with trtexec (detailed layer information and a
# per-layer profile), and read both back into the project with `workbench engine-report`.
#
#   bash scripts/trt_roundtrip.sh PROJECT.qwb [OUT_DIR] [--trust-code] [-- TRTEXEC_ARGS...]
#
# OUT_DIR (default: PROJECT's folder/PROJECT.trt) receives model.onnx, model.engine, layers.json, profile.json,
# trtexec.log and report.txt. Arguments after `--` go to trtexec (e.g. --shapes=input:8x3x224x224 for a
# dynamic batch, --stronglyTyped on TensorRT 10 instead of the default --int8 --fp16).
# Environment: TRTEXEC (the trtexec to run, default: the one on PATH), WORKBENCH (default: python -m workbench).
set -euo pipefail

usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

project="" out="" trust=() trt_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage ;;
        --trust-code) trust=(--trust-code); shift ;;
        --) shift; trt_args=("$@"); break ;;
        -*) echo "trt_roundtrip: unknown option $1 (trtexec's options go after --)" >&2; exit 2 ;;
        *) if [ -z "$project" ]; then project="$1"; elif [ -z "$out" ]; then out="$1"; else usage; fi; shift ;;
    esac
done
[ -n "$project" ] || usage
if [ ! -f "$project" ]; then
    echo "trt_roundtrip: $project: no such project file (.qwb)." >&2
    exit 2
fi
trtexec="${TRTEXEC:-$(command -v trtexec || true)}"
if [ -z "$trtexec" ] || [ ! -x "$trtexec" ]; then
    echo "trt_roundtrip: trtexec not found${TRTEXEC:+ at $TRTEXEC}: this step needs a machine with an NVIDIA GPU and" >&2
    echo "TensorRT. Put trtexec on PATH (it ships in TensorRT's bin/, e.g. /usr/src/tensorrt/bin) or set TRTEXEC." >&2
    echo "Without one: export here (workbench export), build elsewhere with" >&2
    echo "  trtexec --onnx=model.onnx --int8 --fp16 --profilingVerbosity=detailed --exportLayerInfo=layers.json \\" >&2
    echo "          --exportProfile=profile.json --separateProfileRun" >&2
    echo "and read the two files back: workbench engine-report $project layers.json --profile profile.json" >&2
    exit 2
fi
read -r -a workbench <<< "${WORKBENCH:-python -m workbench}"
out="${out:-${project%.qwb}.trt}"
mkdir -p "$out"

echo "== export $project -> $out/model.onnx"
"${workbench[@]}" export "$project" "${trust[@]}" --output "$out/model.onnx" --force
[ ${#trt_args[@]} -gt 0 ] || trt_args=(--int8 --fp16)

echo "== build with $trtexec (log: $out/trtexec.log)"
if ! "$trtexec" --onnx="$out/model.onnx" --saveEngine="$out/model.engine" \
        --profilingVerbosity=detailed --exportLayerInfo="$out/layers.json" \
        --exportProfile="$out/profile.json" --separateProfileRun "${trt_args[@]}" > "$out/trtexec.log" 2>&1; then
    echo "trt_roundtrip: trtexec failed; the last lines of $out/trtexec.log:" >&2
    tail -n 20 "$out/trtexec.log" >&2
    exit 1
fi
for file in layers.json profile.json; do
    if [ ! -s "$out/$file" ]; then
        echo "trt_roundtrip: trtexec wrote no $out/$file (see $out/trtexec.log)." >&2
        exit 1
    fi
done

echo "== engine-report"
"${workbench[@]}" engine-report "$project" "${trust[@]}" "$out/layers.json" --profile "$out/profile.json" \
    --onnx "$out/model.onnx" | tee "$out/report.txt"
