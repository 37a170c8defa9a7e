"""The project file (sqlite-utils): schema, migrations, tensors stored as bytes.

The face imports its modules on first use (scientific-python's ``lazy_loader``, SPEC 1):
``workbench.project.settings`` or the errors come without the project model's sources (torch) and the store
(sqlite-utils).
"""
from typing import TYPE_CHECKING

import lazy_loader

from workbench.project.errors import ProjectChangedError, ProjectError  # light: every front end catches them

__getattr__, _, _lazy = lazy_loader.attach(__name__, submod_attrs={
    "model": ("CalibrationRecord", "ExportRecord", "FallbackRecord", "FinetuneRecord",
                                "LayerDecision", "LintRecord", "Project", "QuantizerRecord", "SensitivityRecord"),
    "store": ("PROJECT_SUFFIX", "SaveReport", "file_revision", "load_project", "save_project"),
})
__all__ = ["ProjectChangedError", "ProjectError", *_lazy]


def __dir__() -> list[str]:  # the light names imported above, and the lazy ones
    return sorted(__all__)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ resolves them
    from workbench.project.model import (  # noqa: F401 - the public names of __all__
        CalibrationRecord,
        ExportRecord,
        FallbackRecord,
        FinetuneRecord,
        LayerDecision,
        LintRecord,
        Project,
        QuantizerRecord,
        SensitivityRecord,
    )
    from workbench.project.store import PROJECT_SUFFIX, SaveReport, file_revision, load_project, save_project  # noqa: F401
