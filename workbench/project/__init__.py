"""The project file (sqlite-utils): schema, migrations, tensors stored as bytes."""
from workbench.project.errors import ProjectChangedError, ProjectError  # noqa: F401
from workbench.project.model import (  # noqa: F401
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
