"""The error every session request raises when it cannot be carried out as asked."""
from __future__ import annotations

__all__ = ["SessionError"]


class SessionError(ValueError):
    """A request the session cannot carry out as asked; the message says why and what to do."""
