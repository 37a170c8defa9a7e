"""A new user's first hour with the CLI (issue 18): what they trip on, each fixed and checked end to end."""
import json
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.cli_run import run
from workbench import cli


@pytest.fixture(scope="module")
def _template(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "digits.qwb"
    code = cli.main([str(a) for a in ("new", path, "--model", "demo:digits", "--data", "demo:digits:train",
                                      "--eval-data", "demo:digits:test", "--batch-size", "64", "--num-batches",
                                      "2")])
    assert code == 0
    return path


@pytest.fixture
def project(_template, tmp_path):
    path = tmp_path / "digits.qwb"
    shutil.copy(_template, path)
    return path


# ----- 1. descriptors TensorRT cannot use ------------------------------------------------------------


def test_a_weight_axis_tensorrt_cannot_use_is_refused_at_set_with_the_reason(project, capsys):
    code, _, err = run(capsys, "set", project, "--layer", "stem.0", "--weight-desc", "axis=2")
    assert code == 2
    assert "stem.0: TensorRT takes Conv2d weights per-tensor (axis=none) or per output channel (axis=0), " \
           "not axis=2" in err
    code, out, _ = run(capsys, "show", project, "--json")
    rows = {row["name"]: row for row in json.loads(out)["layer_table"]}
    assert rows["stem.0"]["weight_summary"] == "int8 per-channel(0) max"  # unchanged


def test_a_per_channel_activation_is_refused_at_set(project, capsys):
    code, _, err = run(capsys, "set", project, "--layer", "fc", "--input-desc", "axis=1")
    assert code == 2 and "per-tensor only (axis=none)" in err and "fc:" in err


def test_per_tensor_weights_are_accepted(project, capsys):
    code, out, err = run(capsys, "set", project, "--layer", "fc", "--weight-desc", "axis=none")
    assert code == 0, err
    assert "note:" not in out


def test_4_bit_weights_are_accepted_as_simulation_only_marked_and_refused_by_export(project, tmp_path, capsys):
    code, out, err = run(capsys, "set", project, "--type", "Conv2d", "--weight-desc", "num_bits=4")
    assert code == 0, err
    assert "note: stem.0, block.conv1, block.conv2, expand.0: 4-bit weights are for simulation and fine-tuning " \
           "only (sim only)" in out
    code, out, _ = run(capsys, "show", project)
    assert "int4 per-channel(0) max, sim only" in out
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    code, _, err = run(capsys, "export", project, "-o", tmp_path / "x.onnx")
    assert code == 2 and "8-bit" in err and not (tmp_path / "x.onnx").exists()


def test_the_default_input_descriptor_is_checked_too(project, capsys):
    from workbench.session import Session, SessionError

    session = Session.open(project)
    with pytest.raises(SessionError, match="per-tensor only"):
        session.set_setting("defaults", {"input": {"calib_method": "histogram", "axis": 1}, "weight": None})


# ----- 2. one source of truth for defaults -----------------------------------------------------------


def _help(capsys, command):
    assert cli.main([command, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_shows_the_defaults_that_run(tmp_path, capsys):
    from workbench.project.settings import DEFAULT_SETTINGS

    defaults = DEFAULT_SETTINGS["calibration"]
    calibrate_help, new_help = _help(capsys, "calibrate"), _help(capsys, "new")
    assert f"new projects: {defaults['num_batches']})" in calibrate_help
    assert f"in %, a number in (0, 100], e.g. 99.9 (default: the project's; new projects: {defaults['percentile']})" \
        in " ".join(calibrate_help.split())
    assert "default: all" not in new_help and f"(default: {defaults['num_batches']}, or all" in new_help
    assert f"(default: {DEFAULT_SETTINGS['metric']['name']})" in new_help

    # a project on more batches than the default: calibration runs exactly as many as the help says
    path = tmp_path / "many.qwb"
    assert run(capsys, "new", path, "--model", "demo:digits", "--data", "demo:digits:train", "--batch-size",
               "4")[0] == 0
    code, out, err = run(capsys, "show", path)
    assert f"settings: calibration {defaults['method']} on {defaults['num_batches']} batches (percentile " \
           f"{defaults['percentile']}%), metric {DEFAULT_SETTINGS['metric']['name']}; placement rules concat on" in out
    code, out, err = run(capsys, "calibrate", path, "--method", "max", "--json")
    assert code == 0, err
    assert json.loads(out)["batches"] == defaults["num_batches"]


def test_new_num_batches_is_what_calibration_uses(project, capsys):
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--json")
    assert code == 0 and json.loads(out)["batches"] == 2
    code, out, _ = run(capsys, "show", project, "--json")
    assert json.loads(out)["settings"]["calibration"]["num_batches"] == 2


# ----- 3. values that are almost certainly a mistake -------------------------------------------------


def test_a_percentile_under_50_is_refused_unless_forced_and_each_warning_prints_once(project, capsys):
    code, _, err = run(capsys, "calibrate", project, "--method", "percentile", "--percentile", "0.999")
    assert code == 2 and "did you mean 99.9?" in err and "--force" in err
    code, out, _ = run(capsys, "show", project)
    assert "calibration: none yet" in out  # nothing was saved

    # in a process of its own, so that the library's logging prints as it does for a user
    result = subprocess.run([sys.executable, "-m", "workbench", "calibrate", str(project), "--method", "percentile",
                             "--percentile", "0.999", "--force"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    printed = [line.split(" ", 1)[1] for line in (result.stdout + result.stderr).splitlines()
               if line.startswith(("warning: ", "WARNING "))]
    assert printed and len(printed) == len(set(printed))


def test_a_percentile_setting_under_50_is_refused_with_the_value_meant(project):
    from workbench.session import Session, SessionError

    with pytest.raises(SessionError, match=r"did you mean 99\.99\?"):
        Session.open(project).set_setting("calibration", {"method": "percentile", "num_batches": 2,
                                                          "percentile": 0.01})


# ----- 4. the README's fallback example, SQNR tolerance, exit code ------------------------------------


def _readme_commands() -> list[list[str]]:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("## The command line", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True)[1:] for line in joined.splitlines() if line.strip()]


def test_the_readme_s_command_line_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = _readme_commands()
    assert any(c[0] == "sensitivity" and "--target" in c for c in commands)
    for command in commands:
        if command[0] == "finetune":  # the training itself is covered by test_cli; keep this test short
            command += ["--steps-per-epoch", "2"]
        code, out, err = run(capsys, *command)
        assert code == 0, (command, err)
        if command[0] == "sensitivity":
            assert "fallback search (target 30) reached" in out


def test_sqnr_tolerance_counts_from_int8_and_an_unreached_goal_exits_3(project, capsys):
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    code, out, err = run(capsys, "sensitivity", project, "--tolerance", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    start = data["sensitivity"]["quantized"]
    assert data["fallback"]["target"] == pytest.approx(start + 2) and data["fallback"]["reached"]
    assert "counts from the all-INT8 value" in data["fallback"]["goal_note"]

    code, out, err = run(capsys, "sensitivity", project, "--target", "500", "--max-units", "1")
    assert code == 3 and "not reached" in out
    assert "did not reach its goal (exit 3)" in err


# ----- 5. trust remembered ---------------------------------------------------------------------------


@pytest.fixture
def code_project(tmp_path, monkeypatch, capsys):
    """A project on a model factory in a file next to it, trusted once at `new`."""
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    (tmp_path / "net.py").write_text(textwrap.dedent("""
        from torch import nn
        def make():
            return nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten())
    """))
    np.save(tmp_path / "x.npy", np.zeros((4, 3, 5, 5), dtype=np.float32))
    path = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", path, "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "x.npy",
                       "--trust-code")
    assert code == 0, err
    return path


def test_trust_given_once_is_remembered_for_this_file_and_this_code(code_project, tmp_path, capsys):
    store = tmp_path / "config" / "quant-workbench" / "trust.json"
    record = json.loads(store.read_text())["projects"][str(code_project.resolve())]
    assert len(record["sha256"]) == 64 and record["references"][0]["files"] == [str(tmp_path / "net.py")]

    code, out, err = run(capsys, "calibrate", code_project, "--method", "max")  # no flag needed
    assert code == 0, err
    code, out, err = run(capsys, "calibrate", code_project, "--method", "max", "--no-trust")
    assert code == 2 and "workbench trust" in err

    # the code changes: asked again, and told why
    (tmp_path / "net.py").write_text((tmp_path / "net.py").read_text() + "\nprint('surprise')\n")
    code, _, err = run(capsys, "calibrate", code_project, "--method", "max")
    assert code == 2 and "its code changed since (net.py)" in err and "surprise" not in err
    code, out, err = run(capsys, "show", code_project)  # described without running it
    assert code == 0, err
    assert "not loaded: its code changed since it was trusted" in out and "surprise" not in out
    assert f"model: net.py:make: importing net.py runs its code ({tmp_path}/net.py)" in out
    code, out, _ = run(capsys, "show", code_project, "--json")
    assert json.loads(out)["trust"] == "changed" and json.loads(out)["code"][0]["role"] == "model"

    code, out, err = run(capsys, "trust", code_project)
    assert code == 0 and "trusted" in out
    code, out, err = run(capsys, "calibrate", code_project, "--method", "max")
    assert code == 0 and "quantizers calibrated" in out, err  # the changed code runs now, as trusted again


def test_a_copied_project_asks_again_and_untrust_forgets(code_project, tmp_path, capsys):
    copy = tmp_path / "copy.qwb"
    shutil.copy(code_project, copy)
    code, out, err = run(capsys, "show", copy)
    assert code == 0 and "not trusted on this machine yet" in out and "workbench trust" in out
    code, _, err = run(capsys, "calibrate", copy)
    assert code == 2 and "--trust-code" in err

    code, out, _ = run(capsys, "untrust", code_project)
    assert code == 0 and "trust forgotten" in out
    code, _, err = run(capsys, "calibrate", code_project)
    assert code == 2 and "--trust-code" in err


def test_the_session_opens_a_trusted_project_without_a_flag(code_project):
    """The GUI opens projects through the session: it needs no flag either."""
    from workbench.session import Session
    from workbench.sources.errors import TrustRequired

    assert Session.open(code_project).trust_code
    assert Session.trust_status(code_project) == "trusted"
    with pytest.raises(TrustRequired):
        Session.open(code_project, remembered=False)


# ----- 6. stale and inconsistent figures -------------------------------------------------------------


def test_show_marks_the_output_sqnr_stale_after_descriptor_changes_and_fallbacks(project, capsys):
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    code, out, _ = run(capsys, "show", project)
    assert "output SQNR" in out and "stale" not in out
    assert run(capsys, "set", project, "--layer", "stem.0", "--weight-desc", "axis=none")[0] == 0
    code, out, _ = run(capsys, "show", project)
    assert "(stale: 1 quantizer has other descriptors than at calibration; recalibrate" in out
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    # an applied fallback leaves the most sensitive layer in float (the goal is out of reach: exit 3)
    assert run(capsys, "sensitivity", project, "--target", "500", "--max-units", "1", "--apply")[0] == 3
    code, out, _ = run(capsys, "show", project, "--json")
    stale = json.loads(out)["calibration"]["output_sqnr_stale"]
    assert len(stale) == 1 and "calibrated quantizers are off now (layers left in float since)" in stale[0]
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    code, out, _ = run(capsys, "show", project, "--json")
    assert json.loads(out)["calibration"]["output_sqnr_stale"] == []


def test_calibrate_and_show_count_the_same_quantizers_and_name_the_shared_ones(tmp_path, capsys):
    (tmp_path / "net.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):  # a concat: its inputs share one quantizer (TensorRT's rule)
            def __init__(self):
                super().__init__()
                self.stem = nn.Conv2d(3, 4, 3, padding=1)
                self.a, self.b, self.head = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1), nn.Conv2d(8, 2, 1)

            def forward(self, x):
                x = torch.relu(self.stem(x))
                return self.head(torch.cat([self.a(x), self.b(x)], 1))

        def make():
            return Net()
    """))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((8, 3, 8, 8), dtype=np.float32))
    path = tmp_path / "cat.qwb"
    assert run(capsys, "new", path, "--model", f"{tmp_path}/net.py:make", "--data", tmp_path / "x.npy",
               "--batch-size", "4", "--trust-code")[0] == 0
    code, out, err = run(capsys, "calibrate", path, "--method", "max")
    assert code == 0, err
    calibrated = int(out.split(" quantizers calibrated")[0])
    code, out, _ = run(capsys, "show", path, "--json")
    counts = json.loads(out)["calibration"]
    assert counts["quantizers"] == calibrated and counts["quantizer_names"] == calibrated + 1
    code, out, _ = run(capsys, "show", path)
    assert f"{calibrated} quantizers ({calibrated + 1} names: 1 shared by a rule)" in out


# ----- 7. files a user can share ---------------------------------------------------------------------


def test_export_into_a_new_folder_under_umask_022_lists_every_file_it_wrote(project, tmp_path, capsys):
    import os
    import stat

    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    target = tmp_path / "out" / "deeper" / "x.onnx"
    previous = os.umask(0o022)
    try:
        code, out, err = run(capsys, "export", project, "-o", target, "--amax-json", "--calibration-cache")
    finally:
        os.umask(previous)
    assert code == 0, err
    files = [target, target.with_suffix(".amax.json"), target.with_suffix(".calib.cache")]
    assert all(path.is_file() for path in files)
    assert [stat.S_IMODE(path.stat().st_mode) for path in files] == [0o644] * 3
    assert out.strip().splitlines()[-1] == "wrote: " + ", ".join(str(path) for path in files)
    assert onnx.load(str(target)).graph.node  # a whole model, not a stub
    # which exporter wrote the file, and why, in the text (it was only in --json)
    assert any(line.startswith("exporter: ") and len(line) > len("exporter: ") for line in out.splitlines())

    missing = tmp_path / "never" / "x.onnx"  # a failed export leaves no folder behind
    assert run(capsys, "export", project, "-o", missing, "--opset", "9")[0] == 2
    assert not missing.parent.exists()


# ----- 8. changing data after `new`; an evaluation that fails -----------------------------------------


def test_set_changes_the_data_with_the_checks_of_new(project, tmp_path, capsys):
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).random((12, 1, 8, 8), dtype=np.float32))
    np.savez(tmp_path / "eval.npz", x=np.zeros((6, 1, 8, 8), np.float32), y=np.zeros(6, np.int64))
    code, out, err = run(capsys, "set", project, "--data", tmp_path / "calib.npy", "--batch-size", "4",
                         "--eval-data", tmp_path / "eval.npz")
    assert code == 0, err
    assert "calibration data: calib.npy" in out and "evaluation data: eval.npz" in out
    code, out, _ = run(capsys, "show", project, "--json")
    assert json.loads(out)["data"] == {"calibration": "calib.npy", "evaluation": "eval.npz"}
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--json")
    assert code == 0 and json.loads(out)["batches"] == 2, err  # 12 samples, 4 a batch, at most 2 (from `new`)

    np.save(tmp_path / "wrong.npy", np.zeros((4, 3, 8, 8), np.float32))
    code, _, err = run(capsys, "set", project, "--data", tmp_path / "wrong.npy")
    assert code == 2 and "gives inputs of shape (3, 8, 8) per sample, but the model input is (1, 8, 8)" in err
    code, out, _ = run(capsys, "show", project, "--json")
    assert json.loads(out)["data"]["calibration"] == "calib.npy"  # as it was


def test_a_failed_evaluation_says_the_calibration_was_saved_and_the_evaluation_was_not(project, capsys,
                                                                                       monkeypatch):
    from workbench.session import Session

    def broken(self, *args, **kwargs):
        raise ValueError("the evaluation data ran out")

    monkeypatch.setattr(Session, "evaluate", broken)
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--evaluate")
    assert code == 2 and "quantizers calibrated" in out
    assert (f"the calibration was saved to {project}, but the evaluation failed and was not done: ValueError: "
            "the evaluation data ran out") in err
    code, out, _ = run(capsys, "show", project)
    assert "calibration: max on 2 batches" in out


# ----- 9. smaller ------------------------------------------------------------------------------------


def test_gui_without_a_display_says_how_to_get_one(monkeypatch, capsys):
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    code, _, err = run(capsys, "gui", "p.qwb")
    assert code == 2 and "no display" in err and "xvfb-run -a workbench gui p.qwb" in err
    assert "QT_QPA_PLATFORM=offscreen" in err


def test_a_folder_of_npy_files_is_data_and_a_wrong_shape_is_named(project, tmp_path, capsys):
    folder = tmp_path / "samples"
    folder.mkdir()
    for i in range(6):
        np.save(folder / f"{i:02d}.npy", np.full((1, 8, 8), i, np.float32))
    code, out, err = run(capsys, "set", project, "--data", folder, "--batch-size", "4", "--mean", "0.5",
                         "--resize", "8")
    assert code == 0, err
    assert "note: --resize, --mean apply to folders of images" in err and "ignored" in err
    code, out, err = run(capsys, "calibrate", project, "--method", "max", "--json")
    assert code == 0 and json.loads(out)["batches"] == 2, err  # 6 samples of 4: two batches

    np.save(folder / "99.npy", np.zeros((1, 8, 9), np.float32))
    code, _, err = run(capsys, "set", project, "--data", folder)
    assert code == 2 and "99.npy: shape (1, 8, 9) float32, but 00.npy (the first file) is (1, 8, 8)" in err


def test_help_texts_are_whole(capsys):
    set_help = _help(capsys, "set")
    assert "--rule RULE=true|false switch a TensorRT placement rule on or off (repeatable): concat, maxpool, " \
           "residual (all on by default)" in set_help
    assert "percent" in _help(capsys, "calibrate")


def test_fine_tuning_unlabelled_data_says_how_to_give_labels(project, tmp_path, capsys):
    np.save(tmp_path / "unlabelled.npy", np.zeros((8, 1, 8, 8), np.float32))
    assert run(capsys, "calibrate", project, "--method", "max")[0] == 0
    code, _, err = run(capsys, "finetune", project, "--epochs", "1", "--train-data", tmp_path / "unlabelled.npy")
    assert code == 2 and "an .npz holding two arrays, the inputs and the labels" in err
    assert "--train-data" in (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_scripts_point_at_no_missing_notes_and_ignore_the_demo_output():
    root = Path(__file__).resolve().parents[1]
    for script in ("demo.sh", "test.sh", "setup-env.sh"):
        text = (root / "scripts" / script).read_text()
        for word in text.split():
            if word.endswith(".md"):  # a notes file a comment points at must be in the repository
                assert (root / "scripts" / word.strip("()")).resolve().is_file(), (script, word)
    assert "/workbench-demo/" in (root / ".gitignore").read_text().split()


def test_setup_env_skips_pip_install_when_nothing_changed(tmp_path):
    """A second run of scripts/demo.sh does not reinstall: setup-env.sh keeps a stamp in the venv."""
    root = Path(__file__).resolve().parents[1]
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    (venv / "bin" / "python").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$*" >> "{log}"; exit 0; fi
        exec "{sys.executable}" "$@"
    """))
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv / "bin"}:$PATH"\n')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "WORKBENCH_VENV": str(venv), "PYTHON": sys.executable,
           "PYTHONPATH": str(root)}

    def setup() -> int:
        subprocess.run(["bash", "-c", f'source "{root}/scripts/setup-env.sh"'], env=env, check=True,
                       capture_output=True, timeout=300)
        return len(log.read_text().splitlines()) if log.exists() else 0

    assert setup() == 1
    assert setup() == 1  # nothing changed: no pip install
    env["WORKBENCH_EXTRAS"] = "test"
    assert setup() == 2  # other extras: installed once more
