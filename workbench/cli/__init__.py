"""The ``workbench`` command line (``python -m workbench``, the ``workbench`` console script).

:mod:`workbench.cli.entry` holds :func:`main` and the parser; :mod:`workbench.cli.common` the helpers every
command shares; :mod:`workbench.cli.project`, :mod:`~workbench.cli.jobs`, :mod:`~workbench.cli.engine` and
:mod:`~workbench.cli.trust` the commands, by group. Importing the package loads no torch: each command
imports what it runs when it runs.
"""
from workbench.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
