"""Errors of model and data sources: each message names the file and what was wrong."""


class SourceError(ValueError):
    """A model or data source could not be used."""


class TrustRequired(SourceError):
    """Using this source runs its Python code (a factory, a pickle); the user has to trust it first."""


class EntryPointError(SourceError):
    """An entry point (``file.py:function`` / ``package.module:function``) is malformed or cannot be loaded."""
