"""scripts/trt_roundtrip.sh: export -> trtexec -> engine-report in one command. TensorRT is not on this machine, so a
stand-in trtexec checks the arguments the script gives it and writes trtexec-format reports; without any trtexec the
script fails with what to do instead."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from workbench.project import load_project

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "trt_roundtrip.sh"

FAKE_TRTEXEC = """#!/usr/bin/env bash
set -e
for arg in "$@"; do
    case "$arg" in
        --onnx=*) onnx="${arg#--onnx=}" ;;
        --exportLayerInfo=*) layers="${arg#--exportLayerInfo=}" ;;
        --exportProfile=*) profile="${arg#--exportProfile=}" ;;
    esac
done
echo "$@" > "$(dirname "$layers")/args.txt"
test -s "$onnx" || { echo "no ONNX file at $onnx" >&2; exit 1; }
cp "$FAKE_LAYERS" "$layers"
cp "$FAKE_PROFILE" "$profile"
"""


def run(args, **env):
    environment = {**os.environ, "WORKBENCH": f"{sys.executable} -m workbench", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=600)


def test_missing_trtexec_fails_clearly(demo_export, tmp_path):
    project = tmp_path / "digits.qwb"
    shutil.copy(demo_export[1], project)
    result = run([str(project)], PATH="/usr/bin:/bin", TRTEXEC="")
    assert result.returncode == 2
    assert "trtexec not found" in result.stderr and "--exportLayerInfo=layers.json" in result.stderr
    assert load_project(project).engine_reports == [] and not (tmp_path / "digits.trt").exists()


def test_round_trip_with_a_stand_in_trtexec(demo_export, trtexec_files, tmp_path):
    layer_info, profile, _ = trtexec_files
    project = tmp_path / "digits.qwb"
    shutil.copy(demo_export[1], project)
    fake = tmp_path / "bin" / "trtexec"
    fake.parent.mkdir()
    fake.write_text(FAKE_TRTEXEC)
    fake.chmod(0o755)
    out = tmp_path / "out"
    result = run([str(project), str(out), "--", "--stronglyTyped"], TRTEXEC=str(fake),
                 FAKE_LAYERS=str(layer_info), FAKE_PROFILE=str(profile))
    assert result.returncode == 0, result.stderr
    args = (out / "args.txt").read_text()
    assert "--profilingVerbosity=detailed" in args and "--separateProfileRun" in args and "--stronglyTyped" in args
    assert "--int8" not in args  # trtexec arguments after -- replace the default precision flags
    assert (out / "model.onnx").is_file() and "ran FP32" in (out / "report.txt").read_text()
    [record] = load_project(project).engine_reports
    assert record.data["onnx"] == str(out / "model.onnx") and record.data["unmapped"] == []
    assert json.loads(json.dumps(record.data))["quantized_found"] == record.data["quantized_total"]
