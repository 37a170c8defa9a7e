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


def test_evaluate_measures_the_metric_asked_for_on_both_models():
    """The defect: evaluate returned the metric's name; it returns the metric's FP32 and INT8 values."""
    from workbench.analysis import Evaluation, get_metric

    session = Session.create(ModelSpec("demo", "digits"),
                             DataSpec("demo", "digits", split="train", batch_size=32, num_batches=2))
    session.calibrate(method="max", num_batches=2)
    top1, cosine = session.evaluate("top1"), session.evaluate("cosine")
    assert isinstance(top1, Evaluation) and top1.name == "top-1 accuracy" and top1.num_batches == 2
    assert 0.5 < top1.fp32 <= 1.0 and 0.5 < top1.int8 <= 1.0
    assert cosine.metric["kind"] == "cosine" and cosine.fp32 == pytest.approx(1.0) and 0.9 < cosine.int8 < 1.0
    assert cosine.output_sqnr_db == pytest.approx(top1.output_sqnr_db)
    assert session.evaluate("sqnr").int8 == pytest.approx(top1.output_sqnr_db)

    seen = []

    def largest_logit(model, batches):  # a user metric runs the model itself
        seen.append(model)
        return float(max(model(batch[0]).max() for batch in batches))

    user = session.evaluate(get_metric(largest_logit, "higher"))
    assert seen == [session.float_model, session.quantized_model()]
    assert user.fp32 != user.int8 and user.metric["direction"] == "higher"
    assert user.output_sqnr_db == pytest.approx(top1.output_sqnr_db)
