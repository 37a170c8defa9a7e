"""Measure a metric on configurations of one model over one fixed set of batches.

The shared engine of :func:`~workbench.analysis.sensitivity` and
:func:`~workbench.analysis.fallback_search`: it materialises the batches (so every pass sees the same
data, even from a shuffling loader), moves inputs to the model's device once, computes the FP32
reference outputs once, switches quantizers between configurations, and turns every failure into an
:class:`AnalysisError` or :class:`MetricError` that names the unit being measured.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from workbench.analysis.errors import AnalysisCancelled, AnalysisError, MetricError, describe_stage
from workbench.analysis.metrics import Metric, ModelMetric, OutputMetric
from workbench.analysis.units import Unit
from workbench.quant.algorithms.batches import model_device, model_inputs, select_output, to_device
from workbench.quant.algorithms.calibrate import CancelToken, ProgressCallback
from workbench.quant.algorithms.distributed import Digest, DistContext
from workbench.quant.algorithms.snapshot import all_quantizers, is_quantizing
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

logger = logging.getLogger(__name__)

__all__ = ["Evaluator", "materialise_batches", "same_output", "report_progress", "check_ranks_agree"]


def report_progress(progress: ProgressCallback | None, done: int, total: int, message: str) -> None:
    """Tell ``progress`` (if any) that ``done`` of ``total`` evaluations have run, with ``message``."""
    if progress is not None:
        progress(done, total, message)


def materialise_batches(batches: Iterable, num_batches: int | None) -> list:
    """The batches as a list (the first ``num_batches``), so every pass sees exactly the same data.

    Raises:
        ValueError: no batches, or a bad ``num_batches``.
    """
    if num_batches is not None and (isinstance(num_batches, bool) or not isinstance(num_batches, int)
                                    or num_batches < 1):
        raise ValueError(f"num_batches must be a positive integer or None, got {num_batches!r}.")
    if isinstance(batches, torch.Tensor):
        raise TypeError("batches must be an iterable of batches (a list or a data loader), not a single tensor; "
                        "wrap it as [tensor].")
    materialised = []
    for batch in batches:
        if num_batches is not None and len(materialised) >= num_batches:
            break
        model_inputs(batch)  # a malformed batch fails here, before any pass
        materialised.append(batch)
    if not materialised:
        raise ValueError("No batches: the data source yielded nothing.")
    return materialised


def check_ranks_agree(context: DistContext, batches: Sequence[Any], model: nn.Module, job: str, settings: Any) -> None:
    """Before ranks share work: every rank must hold the same batches, settings and model (weights and
    calibration), or their results would be merged across two different jobs.

    Raises:
        RanksDisagree: which part differs, with the ranks grouped by what they hold.
    """
    if not context.distributed:
        return
    context.check_same({"data": Digest().update(list(batches)).hexdigest(),
                        "settings": Digest().update(settings).hexdigest(),
                        "model and calibration": Digest().update(dict(model.state_dict())).hexdigest()}, job)


class Evaluator:
    """Runs ``model`` over fixed batches in chosen quantizer configurations and measures ``metric``.

    Call inside a :class:`~workbench.quant.algorithms.snapshot.ModelSnapshot` and ``torch.no_grad()``: it switches
    the model to eval mode and turns calibration off, and relies on the snapshot to undo that.
    ``output`` names the output entry the metric compares (see
    :func:`~workbench.quant.algorithms.batches.select_output`).
    """

    def __init__(self, model: nn.Module, batches: Sequence[Any], metric: Metric,
                 cancel: CancelToken | None = None, output: str | None = None) -> None:
        self.model = model
        self.output = output
        self.batches = list(batches)
        self.metric = metric
        self.cancel = cancel
        self.device = model_device(model)
        self.inputs = [tuple(to_device(part, self.device) for part in model_inputs(b)) for b in self.batches]
        self.quantizers = all_quantizers(model)
        self._was_disabled = {q: not q.is_enabled for q in self.quantizers}
        self.reference: list[Any] | None = None
        self.first_output: dict[str, Any] = {}  # batch 0's output per baseline, to check a prefix plan
        uncalibrated = [q for q in self.quantizers if is_quantizing(q) and not q.has_amax
                        and not q.learn_amax]
        if uncalibrated:
            logger.warning("%d quantizers have no amax and quantize with each tensor's own range: calibrate "
                           "the model first for a meaningful analysis.", len(uncalibrated))
        model.eval()
        for q in self.quantizers:  # a model left calibrating would collect statistics on every pass
            q.disable_calib()
        if isinstance(metric, ModelMetric):
            metric.load()  # a bad entry point fails before any pass (EntryPointError)

    # ----- configurations ---------------------------------------------------------------------

    def quantizer_objects(self, unit: Unit) -> list[TensorQuantizer]:
        return [self.model.get_submodule(name) for name in unit.quantizers]

    def configure(self, base: str, *, off: Iterable[TensorQuantizer] = (), on: Iterable[TensorQuantizer] = ()) -> None:
        """Every quantizer off (``base="fp32"``) or as the caller had it (``"quantized"``), then ``off``
        switched off and ``on`` switched on."""
        for q in self.quantizers:
            q.set_enabled(False if base == "fp32" else not self._was_disabled[q])
        for q in off:
            q.disable()
        for q in on:
            q.enable()

    # ----- measuring --------------------------------------------------------------------------

    def check_cancel(self, where: str) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise AnalysisCancelled(f"Analysis cancelled ({where}).")

    def _checked(self, value: Any, stage: str, unit: str | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise MetricError(self.metric.name, unit=unit, stage=stage, value=value) from None
        if not self.metric.is_valid(number):
            raise MetricError(self.metric.name, unit=unit, stage=stage, value=number)
        return number

    def measure(self, stage: str, unit: str | None = None,
                run_batch: Callable[[int], Any] | None = None, keep_outputs: bool = False) -> float:
        """The metric in the current configuration.

        Args:
            stage, unit: what is being measured, for error messages.
            run_batch: computes the output of batch ``i`` (default: call the model); an
                :class:`OutputMetric` only.
            keep_outputs: keep every output as the FP32 reference (the ``"fp32"`` stage).

        Raises:
            AnalysisCancelled: the cancel token was set (checked before each batch).
            AnalysisError: the model raised on a batch.
            MetricError: the metric raised or gave an invalid value.
        """
        if isinstance(self.metric, ModelMetric):
            self.check_cancel(describe_stage(stage, unit))
            try:
                # the user's metric runs the model itself: on its own copy of the batches, as each pass does
                value = self.metric.evaluate(self.model, [to_device(b, None, copy=True) for b in self.batches])
            except Exception as error:  # the user's metric (and model inside it): report where
                raise MetricError(self.metric.name, unit=unit, stage=stage, original=error) from error
            return self._checked(value, stage, unit)
        assert isinstance(self.metric, OutputMetric)
        if run_batch is None:
            run_batch = self._call_model
        accumulator = self.metric.start()
        outputs = []
        for i, batch in enumerate(self.batches):
            self.check_cancel(describe_stage(stage, unit))
            try:
                output = select_output(run_batch(i), self.output)
            except Exception as error:  # the user's model, or an output key it does not have
                raise AnalysisError(f"The model failed on batch {i} {describe_stage(stage, unit)}: "
                                    f"{type(error).__name__}: {error}", unit=unit, stage=stage, batch_index=i,
                                    original=error) from error
            if i == 0 and stage in ("fp32", "quantized"):
                self.first_output[stage] = output
            if keep_outputs:
                outputs.append(output)
            reference = output if self.reference is None else self.reference[i]
            try:
                accumulator.update(output, reference, batch)
            except Exception as error:
                raise MetricError(self.metric.name, unit=unit, stage=stage, original=error, batch_index=i) from error
        if keep_outputs:
            self.reference = outputs
        try:
            value = accumulator.value()
        except Exception as error:
            raise MetricError(self.metric.name, unit=unit, stage=stage, original=error) from error
        return self._checked(value, stage, unit)

    def outputs(self, stage: str, indices: Iterable[int]) -> dict[int, Any]:
        """The model's outputs on batches ``indices`` in the current configuration (one rank's share of a
        pass whose outputs the ranks then exchange).

        Raises:
            AnalysisCancelled, AnalysisError: as :meth:`measure` does.
        """
        found = {}
        for i in indices:
            self.check_cancel(describe_stage(stage, None))
            try:
                found[i] = self._call_model(i)
            except Exception as error:  # the user's model
                raise AnalysisError(f"The model failed on batch {i} {describe_stage(stage, None)}: "
                                    f"{type(error).__name__}: {error}", unit=None, stage=stage, batch_index=i,
                                    original=error) from error
        return found

    def fresh_inputs(self, i: int) -> tuple[tuple, dict]:
        """A copy of batch ``i``'s inputs (args, kwargs) for one pass.

        Every pass gets its own copy: a model that edits its input in place would otherwise feed the next
        configuration (INT8 after FP32, each sensitivity pass) an already-changed batch. One memory copy of
        the inputs per call: bench/input_copy.py measures what it costs against the pass itself.
        """
        args, kwargs = self.inputs[i]
        return to_device(args, self.device, copy=True), to_device(kwargs, self.device, copy=True)

    def _call_model(self, i: int) -> Any:
        args, kwargs = self.fresh_inputs(i)
        return self.model(*args, **kwargs)

    def measure_fp32(self) -> float:
        """Every quantizer off: the reference outputs (kept) and the FP32 metric."""
        self.configure("fp32")
        return self.measure("fp32", keep_outputs=isinstance(self.metric, OutputMetric))

    def measure_quantized(self) -> float:
        """Every quantizer as the caller had it."""
        self.configure("quantized")
        return self.measure("quantized")


def same_output(a: Any, b: Any) -> bool:
    """Whether two model outputs are identical, bit for bit (NaN matching NaN), with the same structure."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.is_floating_point():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_output(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same_output(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # an object without a usable ==
        return False
