"""The project file (sqlite-utils): schema, migrations, tensors stored as bytes.

The face imports its modules on first use (:mod:`workbench.lazy_imports`): ``workbench.project.settings`` or the
errors come without the project model's sources (torch) and the store (sqlite-utils).
"""
from typing import TYPE_CHECKING

from workbench.lazy_imports import lazy_face
from workbench.project.errors import ProjectChangedError, ProjectError  # light: every front end catches them

__getattr__, __dir__, _lazy = lazy_face(__name__, {
    "workbench.project.model": ("CalibrationRecord", "ExportRecord", "FallbackRecord", "FinetuneRecord",
                                "LayerDecision", "LintRecord", "Project", "QuantizerRecord", "SensitivityRecord"),
    "workbench.project.store": ("PROJECT_SUFFIX", "SaveReport", "file_revision", "load_project", "save_project"),
})
__all__ = ["ProjectChangedError", "ProjectError", *_lazy]

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
