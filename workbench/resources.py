"""Where the shipped resources are: demo weights and data, icons, the style sheet.

The same files reach users four ways, and each puts them somewhere else: a source checkout or an
editable install (``resources/`` at the repository root), a wheel (``pip install .`` copies them to
``<prefix>/share/quant-workbench``), the PyInstaller app (under ``sys._MEIPASS``), and a system
package that says where with ``WORKBENCH_RESOURCES``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["RESOURCES", "find_resources"]

# the folder pyproject.toml's data-files install into, under the environment's prefix
INSTALLED = Path("share") / "quant-workbench"


def find_resources(override: str | None, frozen: str | None, source_root: Path, prefix: Path) -> Path:
    """The resources folder, first match in this order: ``override`` (``WORKBENCH_RESOURCES``), the
    frozen app's folder, ``resources/`` in a source tree, the installed copy under ``prefix``.

    With none present the source-tree path is returned, so that a missing file's error names the
    place a developer would look.
    """
    if override:
        return Path(override).expanduser().resolve()
    if frozen:
        return Path(frozen) / "resources"
    in_source = source_root / "resources"
    if in_source.is_dir():
        return in_source
    installed = prefix / INSTALLED
    return installed if installed.is_dir() else in_source


RESOURCES = find_resources(os.environ.get("WORKBENCH_RESOURCES"), getattr(sys, "_MEIPASS", None),
                           Path(__file__).resolve().parents[1], Path(sys.prefix))
