"""An export's INT8-vs-FP32 headline takes the parity check's forwards of the quantized model where the batches are
the same (issue 37: export time): each batch runs the quantized model once and the float model once, and the
headline is what ``evaluate --rounding onnx`` measures on those batches (the rounding the exported graph computes,
the one the parity check needs to match onnxruntime)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli_run import run
from tests.transformers.checkpoints import save_bf16_llama
from workbench.project.settings import jsonable
from workbench.session import Session
from workbench.session.exports import HEADLINE_BATCHES
from workbench.sources import model_source

pytest.importorskip("accelerate")

BATCH = 4  # the projects' batch size: the forwards of whole batches (references run 1, 2 and 1 x 17 tokens)


class Forwards:
    """Whole-model forwards of the quantized and the float model on batches of :data:`BATCH` samples, counted per
    batch of token ids (the graph capture traces other shapes, on fake tensors)."""

    def __init__(self, session: Session) -> None:
        self.counts: dict[str, Counter] = {"quantized": Counter(), "float": Counter()}
        models = {"quantized": session.quantized_model(), "float": session.float_model}
        assert models["quantized"] is not models["float"]
        self.handles = [model.register_forward_pre_hook(self._hook(kind), with_kwargs=True)
                        for kind, model in models.items()]

    def _hook(self, kind: str):
        def count(module, args, kwargs):
            if torch.compiler.is_compiling():  # the capture: a look at a symbolic shape would fix it in the graph
                return
            ids = kwargs.get("input_ids", args[0] if args else None)
            if type(ids) is torch.Tensor and ids.dim() == 2 and ids.shape[0] == BATCH:
                self.counts[kind][tuple(map(tuple, ids.tolist()))] += 1
        return count

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _batches(ids: Path) -> list[tuple]:
    rows = np.load(ids)
    return [tuple(map(tuple, rows[i:i + BATCH].tolist())) for i in range(0, len(rows), BATCH)]


def _measured(values: dict) -> dict:
    """What an evaluation measured, as the project stores it (an SQNR of FP32 against itself is "inf")."""
    values = jsonable(values)
    return {key: values[key] for key in ("metric", "fp32", "int8", "output_sqnr_db", "num_batches", "quantized_as")}


@pytest.fixture(params=["never", "always"], ids=["eager", "lazily-opened"])
def opened(request, monkeypatch):
    """Both routes: the model in memory, and streamed from its checkpoint (the parity forwards page it in)."""
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, request.param)
    return request.param


def _calibrated(tmp_path: Path, capsys, *extra: str) -> Path:
    folder = save_bf16_llama(tmp_path, 64)  # 12 rows of 16 tokens: 3 batches of 4
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"hf:{folder}", "--data", tmp_path / "ids.npy",
                       "--batch-size", str(BATCH), "--output-key", "logits", *extra)
    assert code == 0, err
    assert run(capsys, "set", project, "--type", "Linear", "--precision", "int8")[0] == 0
    code, _, err = run(capsys, "calibrate", project, "--method", "max")
    assert code == 0, err
    return project


def _export_counting(project: Path, tmp_path: Path) -> tuple[Session, object, Forwards]:
    """The project exported to ``p.onnx`` with its whole-model forwards counted."""
    session = Session.open(project)
    forwards = Forwards(session)
    try:
        report = session.export(tmp_path / "p.onnx")
    finally:
        forwards.remove()
    return session, report, forwards


def test_each_batch_runs_each_model_once_and_the_headline_is_evaluate_as_exported(tmp_path, capsys, opened):
    project = _calibrated(tmp_path, capsys)
    session, report, forwards = _export_counting(project, tmp_path)
    batches = _batches(tmp_path / "ids.npy")
    assert len(batches) == 3  # every batch is a parity batch (4 by default) and a headline batch (8)
    checked = [row.check for row in report.checks]
    assert [f"parity batch {i} (4 samples)" for i in (1, 2, 3)] == checked[-3:] and "batch size 2" in checked
    assert dict(forwards.counts["quantized"]) == dict.fromkeys(batches, 1)
    assert dict(forwards.counts["float"]) == dict.fromkeys(batches, 1)

    headline = report.int8_vs_fp32
    assert headline["num_batches"] == 3 and headline["data"] == "calibration"
    as_exported = session.evaluate(num_batches=HEADLINE_BATCHES, rounding="onnx")
    assert _measured(headline) == _measured(as_exported.to_dict())  # to the bit
    # the quantizers' own rounding (pytorch-quantization's formula) parts from it at rounding ties only
    own = session.evaluate(num_batches=HEADLINE_BATCHES)
    assert own.output_sqnr_db == pytest.approx(headline["output_sqnr_db"], abs=0.05)
    code, out, err = run(capsys, "evaluate", project, "--num-batches", str(HEADLINE_BATCHES), "--rounding", "onnx",
                         "--json")
    assert code == 0, err
    assert _measured(json.loads(out)) == _measured(headline)


def test_evaluation_data_of_its_own_takes_its_own_quantized_forwards(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "never")
    np.save(tmp_path / "eval.npy", np.random.default_rng(1).integers(0, 64, (8, 16)).astype(np.int64))
    project = _calibrated(tmp_path, capsys, "--eval-data", str(tmp_path / "eval.npy"))
    session, report, forwards = _export_counting(project, tmp_path)
    calibration, evaluation = _batches(tmp_path / "ids.npy"), _batches(tmp_path / "eval.npy")
    # parity on the calibration batches; the headline on the evaluation ones, both models
    assert dict(forwards.counts["quantized"]) == dict.fromkeys(calibration + evaluation, 1)
    assert dict(forwards.counts["float"]) == dict.fromkeys(evaluation, 1)
    assert [row.check for row in report.checks][-3:] == [f"parity batch {i} (4 samples)" for i in (1, 2, 3)]
    headline = report.int8_vs_fp32
    assert headline["data"] == "evaluation" and headline["num_batches"] == 2
    assert _measured(headline) == _measured(session.evaluate(num_batches=HEADLINE_BATCHES, rounding="onnx").to_dict())


def test_a_rounding_evaluate_does_not_know_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(model_source.LAZY_OPEN_VARIABLE, "never")
    project = _calibrated(tmp_path, capsys)
    from workbench.session.errors import SessionError

    with pytest.raises(SessionError, match="rounding is one of pytorch_quantization, onnx, got 'banker'"):
        Session.open(project).evaluate(rounding="banker")


def test_parity_outputs_keep_only_what_the_headline_takes():
    from workbench.session.exports import ParityOutputs

    ids = [torch.arange(8).reshape(2, 4) + 10 * i for i in range(3)]
    logits = {"logits": torch.ones(2, 4, 5), "hidden": torch.zeros(2, 4, 3)}
    same = ParityOutputs(ids, "logits", [(ids[0], None), (ids[1] + 1, None)])  # batch 1 differs
    for index in range(3):
        same(index, logits)
    assert set(same.outputs) == {0} and torch.equal(same.outputs[0], logits["logits"])  # the compared entry only
    assert set(same.known([(ids[0], None), (ids[1] + 1, None)])) == {0} and same.outputs == {}
    other = ParityOutputs(ids, "logits", [(ids[2], None)])  # evaluation data of its own: nothing held
    other(0, logits)
    assert other.outputs == {} and other.known([(ids[2], None)]) == {}
    shuffled = ParityOutputs(ids, "logits", [(ids[0], None)])
    shuffled(0, logits)
    assert shuffled.known([(ids[1], None)]) == {}  # drawn again in another order: not taken
