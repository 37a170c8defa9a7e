"""A project's metric given as ``file.py:function``: found next to the project, trusted only when asked."""
import textwrap

import pytest

from workbench.analysis import EntryPointError, get_metric
from workbench.project import load_project
from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.errors import TrustRequired
from workbench.sources.model_source import ModelSpec

METRIC_CODE = textwrap.dedent("""
    def constant(model, batches):
        return 0.25 + len(batches)
""")


def make_project(folder):
    """A demo-model project in ``folder`` with ``metrics.py:constant`` beside it, written relative."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.py").write_text(METRIC_CODE)
    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2),
                             base_dir=folder, settings={"metric": {"name": "metrics.py:constant",
                                                                   "direction": "higher"}})
    return session.save(folder / "project.qwb")


def test_a_metric_file_next_to_the_project_is_found_from_another_directory(tmp_path, monkeypatch):
    path = make_project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    session = Session.open(path, trust_code=True)
    assert session.project.settings["metric"]["name"] == "metrics.py:constant"
    assert session.metric().evaluate(session.float_model, [None, None]) == 2.25


def test_an_untrusted_project_metric_is_refused_naming_it(tmp_path):
    session = Session.open(make_project(tmp_path / "project"))  # the demo model itself needs no trust
    with pytest.raises(TrustRequired, match=r"metrics\.py:constant.*--trust-code"):
        session.metric()


def test_an_untrusted_entry_point_is_not_even_imported(tmp_path):
    bomb = tmp_path / "bomb.py"
    bomb.write_text("raise RuntimeError('imported')\ndef fn(model, batches):\n    return 1.0\n")
    with pytest.raises(TrustRequired, match="bomb.py:fn"):
        get_metric(f"{bomb}:fn", "higher", trust_code=False).load()
    with pytest.raises(EntryPointError, match="imported"):  # trusted, it runs (and its error is quoted)
        get_metric(f"{bomb}:fn", "higher", trust_code=True).load()
    assert get_metric("top1", trust_code=False).name == "top-1 accuracy"  # built-ins run no user code


def test_a_relative_metric_resolves_against_base_dir_not_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "metrics.py").write_text(METRIC_CODE)
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(EntryPointError, match="no such Python file"):
        get_metric("metrics.py:constant", "higher").load()
    assert get_metric("metrics.py:constant", "higher", base_dir=tmp_path).load()(None, []) == 0.25


def test_metric_and_loss_files_follow_save_as_into_another_folder(tmp_path, monkeypatch):
    path = make_project(tmp_path / "A")
    (tmp_path / "A" / "losses.py").write_text("def loss(outputs, targets):\n    return outputs.sum()\n")
    session = Session.open(path, trust_code=True)
    session.set_setting("finetune", {**session.project.settings["finetune"], "loss": "losses.py:loss"})
    (tmp_path / "B").mkdir()
    moved = session.save(tmp_path / "B" / "copy.qwb")
    settings = load_project(moved).settings
    assert settings["metric"]["name"] == f"{(tmp_path / 'A' / 'metrics.py').resolve()}:constant"
    assert settings["finetune"]["loss"] == f"{(tmp_path / 'A' / 'losses.py').resolve()}:loss"
    monkeypatch.chdir(tmp_path)
    assert Session.open(moved, trust_code=True).metric().evaluate(None, []) == 0.25
    # the original project still says it relative to its own folder
    assert load_project(path).settings["metric"]["name"] == "metrics.py:constant"
