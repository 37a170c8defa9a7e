"""Errors of the QDQ export, each naming the layer, quantizer or input at fault."""
from __future__ import annotations

__all__ = ["ExportError", "QuantizerStateError", "SampleInputError", "UnsupportedOperationError",
           "ExportValidationError"]


class ExportError(RuntimeError):
    """The export did not produce a file; the message says why. Nothing was written at the target path."""


class QuantizerStateError(ExportError):
    """Quantizers that cannot be exported as they are (uncalibrated, still calibrating, not INT8...).

    Attributes:
        problems: ``{quantizer name: what is wrong}``.
    """

    def __init__(self, problems: dict[str, str]) -> None:
        self.problems = dict(problems)
        lines = [f"  {name}: {problem}" for name, problem in self.problems.items()]
        uncalibrated = any("not calibrated" in p or "NaN" in p for p in self.problems.values())
        hint = (" Calibrate the model (or disable these quantizers) before exporting." if uncalibrated else "")
        super().__init__(f"{len(self.problems)} enabled quantizer(s) cannot be exported:\n" + "\n".join(lines) + hint)


class SampleInputError(ExportError):
    """The model fails on the sample inputs (wrong shape, dtype or count).

    Attributes:
        layer: qualified name of the innermost layer that raised ("" for the model's own forward).
        inputs: ``{input name: shape}`` of the sample inputs.
    """

    def __init__(self, layer: str, layer_type: str, inputs: dict[str, tuple], original: BaseException) -> None:
        self.layer = layer
        self.inputs = dict(inputs)
        self.original = original
        shapes = ", ".join(f"{name} {tuple(shape)}" for name, shape in self.inputs.items())
        where = f"layer '{layer}' ({layer_type})" if layer else f"the model's forward ({layer_type})"
        super().__init__(f"The sample inputs do not fit the model: {where} raised "
                         f"{type(original).__name__}: {original}. Sample inputs: {shapes}.")


class UnsupportedOperationError(ExportError):
    """The ONNX exporter cannot translate an operation of the model.

    Attributes:
        operations: the operator names the exporter rejected (e.g. ``"aten::fft_rfft"``), when known.
        layers: qualified names of the layers that call them, when known.
    """

    def __init__(self, message: str, operations: list[str], layers: list[str]) -> None:
        self.operations = list(operations)
        self.layers = list(layers)
        super().__init__(message)


class ExportValidationError(ExportError):
    """The exported file failed validation (onnx.checker, onnxruntime, or parity with PyTorch).

    Attributes:
        stage: ``"checker"``, ``"onnxruntime"`` or ``"parity"``.
        report: the :class:`~workbench.export.ExportReport` figures gathered so far (may be None).
    """

    def __init__(self, stage: str, message: str, report=None) -> None:
        self.stage = stage
        self.report = report
        super().__init__(message)


class UnrolledSequenceError(ExportValidationError):
    """A graph that declares the sequence length dynamic does not run at a longer sequence: it holds the sample's
    length (a loop over the sequence, Mamba's scan, unrolled when traced). The export fixes the length and says
    so (see :func:`workbench.export.capture.fix_sequence_length`)."""

    def __init__(self, message: str) -> None:
        super().__init__("onnxruntime", message)
