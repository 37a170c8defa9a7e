"""'auto' calibration through the CLI and the session: the default of new projects, each quantizer's method and
reason in calibrate/show (text and --json), kept in the project file, switched by hand and back; the export's
INT8-vs-FP32 headline beside its parity."""
import json

import pytest

from workbench import cli
from workbench.project import load_project
from workbench.session import Session, SessionError

SINGLES = {"entropy", "mse", "percentile", "max"}


def run(capsys, *args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def project(tmp_path, capsys):
    path = tmp_path / "digits.qwb"
    code, _, err = run(capsys, "new", path, "--model", "demo:digits", "--data", "demo:digits:train",
                       "--eval-data", "demo:digits:test", "--batch-size", "64", "--num-batches", "3",
                       "--metric", "top1")
    assert code == 0, err
    return path


def test_auto_is_the_default_and_says_why(project, capsys):
    code, out, err = run(capsys, "calibrate", project, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["method"] == "auto" and result["sqnr_batches"] == 3 and result["output_sqnr_db"] > 20
    histogram = {n: q for n, q in result["quantizers"].items() if q["choice"] is not None}
    assert len(histogram) == 7  # every input quantizer of the demo's 7 layers (weights are max-calibrated)
    for item in histogram.values():
        choice = item["choice"]
        assert item["method"] == choice["method"] in SINGLES and choice["criterion"] == "layer output"
        assert choice["reason"].startswith(f"{item['method']}: SQNR of ") and choice["batches"] == 3
        assert set(choice["amax"]) == SINGLES and item["amax"] == pytest.approx(choice["amax"][item["method"]])
        # the pick is the best measured candidate
        assert choice["sqnr_db"][item["method"]] == max(choice["sqnr_db"].values())
    assert sum(result["picked"].values()) == 7

    code, out, err = run(capsys, "show", project)
    assert code == 0, err
    assert "calibration: auto on 3 batches" in out and "over 3 batches" in out and "auto picked" in out
    assert "block.conv1._input_quantizer: " in out and " (auto)" in out

    code, out, err = run(capsys, "show", project, "--json")
    shown = json.loads(out)["calibration"]
    assert shown["sqnr_batches"] == 3 and sum(shown["picked"].values()) == 7
    assert shown["choices"]["block.conv1._input_quantizer"]["reason"] == \
        histogram["block.conv1._input_quantizer"]["choice"]["reason"]

    # the choice is in the project file, and switching by hand then back to auto restores the pick
    record = load_project(project).calibrations[-1].quantizers["block.conv1._input_quantizer"]
    assert record.choice["method"] == record.method and record.reason
    session = Session.open(project)
    picked = record.method
    other = next(m for m in ("entropy", "mse") if m != picked)
    session.recompute_amax(["block.conv1._input_quantizer"], other)
    layer = next(v for v in session.layers() if v.name == "block.conv1")
    assert "set by hand" in layer.amax_reason and layer.input_summary.endswith(f"hist/{other}")
    amax = session.recompute_amax(["block.conv1._input_quantizer"], "auto")["block.conv1._input_quantizer"]
    assert amax == pytest.approx(record.choice["amax"][picked])
    assert session.project.current_calibration.quantizers["block.conv1._input_quantizer"].method == picked


def test_old_projects_keep_their_method_and_auto_needs_a_measurement(project, capsys):
    session = Session.open(project)
    session.update_setting("calibration", method="entropy")  # as a project saved before auto existed holds
    session.save()
    code, out, err = run(capsys, "calibrate", project, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["method"] == "entropy" and all(q["choice"] is None for q in result["quantizers"].values())
    session = Session.open(project)
    with pytest.raises(SessionError, match="'auto' was not measured .* calibrate with method auto"):
        session.recompute_amax(["block.conv1"], "auto")


def test_export_reports_int8_vs_fp32_beside_its_parity(project, capsys):
    assert run(capsys, "calibrate", project)[0] == 0
    code, out, err = run(capsys, "export", project)
    assert code == 0, err
    assert "INT8 vs FP32 on " in out and "evaluation batches: output SQNR" in out and "top-1" in out
    report = load_project(project).exports[-1].report  # what --json prints, kept in the project
    headline = report["int8_vs_fp32"]
    assert headline["data"] == "evaluation" and headline["metric"]["kind"] == "top1"
    assert 0.8 < headline["int8"] <= 1 and 0.8 < headline["fp32"] <= 1 and 15 < headline["output_sqnr_db"] < 80
    assert report["cosine"] > 0.999  # parity with the fake-quant model is a different, much closer number
