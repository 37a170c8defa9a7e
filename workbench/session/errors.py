"""The error every session request raises when it cannot be carried out as asked."""
from __future__ import annotations

__all__ = ["SessionError", "EngineNotThisModel"]


class SessionError(ValueError):
    """A request the session cannot carry out as asked; the message says why and what to do."""


class EngineNotThisModel(SessionError):
    """An engine report in which too few of the project's quantized layers are found: another model's engine, or
    names that need the ONNX file it was built from. Nothing was stored; ``force`` or ``onnx_file`` go on."""
