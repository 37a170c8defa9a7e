"""The command line: exit codes and the headless demo."""
import json

from workbench import cli


def test_version(capsys):
    assert cli.main(["version"]) == 0
    assert "Quant Workbench" in capsys.readouterr().out


def test_usage_error_exit_code(capsys):
    assert cli.main(["no-such-command"]) == 2
    assert cli.main(["demo", "--calib-batches", "0"]) == 2
    err = capsys.readouterr().err
    assert "calib-batches" in err and "Traceback" not in err


def test_demo_reports_fp32_and_int8(capsys):
    assert cli.main(["demo", "--method", "all", "--calib-batches", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fp32_accuracy"] > 0.95
    assert [row["method"] for row in report["results"]] == ["max", "entropy", "mse", "percentile"]
    for row in report["results"]:
        assert row["int8_accuracy"] > 0.9
        assert row["output_sqnr_db"] > 20
    assert len(report["replaced"]) == 6
