"""The project file: one SQLite database written with sqlite-utils, one transaction per save.

A save either lands whole or not at all: every table is rewritten inside ``db.atomic()``, so a
process killed half-way leaves SQLite's journal to roll the file back to the previous save. Tensors
(amax, histograms) are stored as raw little-endian bytes with their dtype and shape, never pickled:
opening a stranger's project runs no code. The file says what it is (``PRAGMA application_id``) and
which format it is in (``meta.schema_version``); older formats are migrated on a copy in memory,
newer ones are refused with a clear message.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlite_utils

from workbench import __version__
from workbench.project.errors import ProjectChangedError, ProjectError
from workbench.project.merge import digests, merge
from workbench.project.model import Project, ProjectOrigin, now_iso
from workbench.project.schema_guard import check_schema_objects
from workbench.project.tables import (  # noqa: F401 - encode_array/decode_array: part of the store's API
    SCHEMA_VERSION,
    TABLES,
    check_content,
    content_checksums,
    create_engine_tables,
    create_finetune_tables,
    create_lint_tables,
    create_schema,
    create_smoothing_tables,
    decode_array,
    encode_array,
    read_project,
    write_project,
)
from workbench.sources.errors import SourceError

__all__ = ["ProjectError", "ProjectChangedError", "save_project", "load_project", "SCHEMA_VERSION", "APPLICATION_ID",
           "MIGRATIONS", "migrate", "PROJECT_SUFFIX", "SaveReport", "file_revision"]

APPLICATION_ID = 0x51574231  # "QWB1"
PROJECT_SUFFIX = ".qwb"
SQLITE_MAGIC = b"SQLite format 3\x00"
# Calibration runs kept in a project (their histograms dominate its size).
MAX_CALIBRATION_RUNS = 5
# how long a save or load waits for another process's save to finish
LOCK_TIMEOUT_S = 60.0

# schema version N -> function that upgrades a database from N to N + 1, in place (see the end of the file)
MIGRATIONS: dict[int, Callable[[sqlite_utils.Database], None]] = {}


# ----- save --------------------------------------------------------------------------------------


@dataclass
class SaveReport:
    """What a save did: the file's new revision, and what it took from another process's newer save."""

    revision: int
    merged: list[str] = field(default_factory=list)  # parts another writer changed, kept (e.g. "layer fc")


def save_project(project: Project, path: str | os.PathLike, *, who: str = "this command") -> SaveReport:
    """Write ``project`` to ``path`` in one transaction (all or nothing), without losing another writer's save.

    The file carries a revision number, checked and incremented inside the write transaction. When the
    project was loaded from (or last saved to) ``path`` and the file has been saved by someone else
    since, what the two changed is merged (:func:`workbench.project.merge.merge`); where both changed
    the same thing differently nothing is saved. On success ``project`` becomes what was written
    (the merge included) and remembers the new revision. A project not loaded from ``path`` replaces
    the file (the caller asked to overwrite it).

    Raises:
        ProjectChangedError: another process changed what this one changed; the file is as it was.
        ProjectError: the file cannot be written, or is something other than a project.
    """
    path = Path(path)
    existed = path.exists()
    if existed:
        _check_header(path)
    origin = project.origin if project.origin is not None and Path(project.origin.path) == path.resolve() else None
    try:
        db = sqlite_utils.Database(sqlite3.connect(str(path), isolation_level=None, timeout=LOCK_TIMEOUT_S))
    except sqlite3.Error as error:
        raise ProjectError(f"{path}: cannot be opened for writing ({error}).") from error
    try:
        db.execute("BEGIN IMMEDIATE")  # the write lock before reading the revision: two savers take turns
        try:
            # before any row is deleted or inserted: a trigger the file carries must never run
            check_schema_objects(db, path)
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")  # inside: a refused save changes no byte
            with db.atomic():
                _upgrade_existing(db)  # saving over an older file: its tables get the new columns first
                create_schema(db)
                revision = _revision(db)
                written, merged = project, []
                if origin is not None and revision != origin.revision:
                    written, merged = _merged(db, path, project, origin, who)
                written.modified = now_iso()
                written.saved_in = str(path.resolve().parent)
                written.app_version = __version__
                written.calibrations = written.calibrations[-MAX_CALIBRATION_RUNS:]
                for table in TABLES:
                    db.execute(f"DELETE FROM [{table}]")
                write_project(db, written, revision + 1)
                db["meta"].insert({"key": "checksum", "value": json.dumps(content_checksums(db), sort_keys=True)})
            db.execute("COMMIT")
        except BaseException:
            if db.conn.in_transaction:
                db.conn.rollback()
            raise
    except (sqlite3.Error, OSError) as error:
        db.close()
        if not existed:  # a failed first save leaves no stub that would block the next try
            for leftover in (path, path.with_name(path.name + "-journal")):
                leftover.unlink(missing_ok=True)
            raise ProjectError(f"{path}: saving failed ({error}); no file was written.") from error
        raise ProjectError(f"{path}: saving failed ({error}); the previous save is unchanged.") from error
    finally:
        db.close()
    if written is not project:  # the caller's project becomes what is now in the file
        for item in dataclasses.fields(Project):
            setattr(project, item.name, getattr(written, item.name))
    project.origin = ProjectOrigin(str(path.resolve()), revision + 1, digests(project))
    return SaveReport(revision + 1, merged)


def file_revision(path: str | os.PathLike) -> int | None:
    """The revision of the project file at ``path`` now (None: no readable project there). Cheap: one row."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=LOCK_TIMEOUT_S)
        try:
            return _revision(sqlite_utils.Database(connection))
        finally:
            connection.close()
    except (sqlite3.Error, KeyError, OSError):
        return None


def _revision(db: sqlite_utils.Database) -> int:
    row = next(db["meta"].rows_where("key = ?", ["revision"]), None)
    try:
        return int(row["value"]) if row is not None else 0
    except (TypeError, ValueError):
        return 0


def _merged(db: sqlite_utils.Database, path: Path, project: Project, origin: ProjectOrigin,
            who: str) -> tuple[Project, list[str]]:
    """The file's newer state with ``project``'s changes on top, or ProjectChangedError."""
    try:
        theirs = read_project(db, path)
    except ProjectError as error:
        raise ProjectChangedError(path, [], who) from error
    merged, conflicts, taken = merge(origin.digests, project, theirs)
    if conflicts:
        raise ProjectChangedError(path, conflicts, who)
    return merged, taken


# ----- load --------------------------------------------------------------------------------------


def _check_header(path: Path) -> None:
    try:
        with open(path, "rb") as handle:
            header = handle.read(100)
    except OSError as error:
        raise ProjectError(f"{path}: cannot be read ({error.strerror or error}).") from error
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise ProjectError(f"{path}: not a Quant Workbench project (not an SQLite database"
                           f"{', or truncated' if header.startswith(SQLITE_MAGIC[:4]) or not header else ''}).")
    application_id = int.from_bytes(header[68:72], "big")
    if application_id != APPLICATION_ID:
        raise ProjectError(f"{path}: an SQLite database, but not a Quant Workbench project.")


def load_project(path: str | os.PathLike) -> Project:
    """Read a project file. Nothing in it is executed.

    Raises:
        ProjectError: the file is missing, not a project, truncated or corrupt, or from a newer version.
    """
    path = Path(path)
    if not path.is_file():
        raise ProjectError(f"{path}: no such project file.")
    _check_header(path)
    try:
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=LOCK_TIMEOUT_S)
        memory = sqlite3.connect(":memory:")
        try:
            source.backup(memory)  # work on a copy: migrations never touch the user's file
        finally:
            source.close()
        db = sqlite_utils.Database(memory)
        check_schema_objects(db, path)
        check = db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise ProjectError(f"{path}: the file is damaged ({check[0] if check else 'no check result'}).")
        version = _schema_version(db, path)
        current = version == SCHEMA_VERSION  # older formats were saved without checksums
        if version < SCHEMA_VERSION and not migrate(db, version):
            raise ProjectError(f"{path}: project format {version} cannot be upgraded by this version.")
        project = read_project(db, path)
        if current:
            check_content(db, path)
        project.origin = ProjectOrigin(str(path.resolve()), _revision(db), digests(project))
        return project
    except ProjectError:
        raise
    except (sqlite3.Error, ValueError, KeyError, TypeError, IndexError, AttributeError, SourceError,
            OverflowError, MemoryError) as error:
        raise ProjectError(f"{path}: not a valid Quant Workbench project ({type(error).__name__}: {error}).") from error


def _schema_version(db: sqlite_utils.Database, path: Path) -> int:
    if "meta" not in db.table_names():
        raise ProjectError(f"{path}: not a Quant Workbench project (no meta table).")
    rows = {r["key"]: r["value"] for r in db["meta"].rows}
    try:
        version = int(rows["schema_version"])
    except (KeyError, ValueError) as error:
        raise ProjectError(f"{path}: the project format version is missing or invalid.") from error
    if version > SCHEMA_VERSION:
        raise ProjectError(f"{path}: saved by a newer Quant Workbench (project format {version}, app "
                           f"{rows.get('app_version', '?')}); this version ({__version__}) reads formats up to "
                           f"{SCHEMA_VERSION}. Update Quant Workbench to open it.")
    if version < 0:
        raise ProjectError(f"{path}: invalid project format version {version}.")
    return version


# ----- migrations --------------------------------------------------------------------------------


def _migrate_1_to_2(db: sqlite_utils.Database) -> None:
    """Version 2 adds fine-tuning (``finetune_runs``, ``finetune_tensors``) and BatchNorm folding.

    A calibration run now records which layers had their BatchNorm folded (``calibration_runs.folded``).
    Version 1 projects were calibrated on unfolded weights, so they get ``fold_bn`` off: reopened,
    they rebuild and restore exactly as they were saved (the user can switch folding on and recalibrate).
    """
    tables = set(db.table_names())
    if "calibration_runs" in tables and "folded" not in db["calibration_runs"].columns_dict:
        db["calibration_runs"].add_column("folded", str)
    create_finetune_tables(db)
    if "settings" in tables and not list(db["settings"].rows_where("key = ?", ["fold_bn"])):
        db["settings"].insert({"key": "fold_bn", "value": "false"})


MIGRATIONS[1] = _migrate_1_to_2


def _migrate_2_to_3(db: sqlite_utils.Database) -> None:
    """Version 3 adds imported TensorRT engine reports (``engine_reports``); nothing else changes."""
    create_engine_tables(db)


MIGRATIONS[2] = _migrate_2_to_3


def _migrate_3_to_4(db: sqlite_utils.Database) -> None:
    """Version 4 keeps the last fusion lint (``lint_runs``) and, per calibration run, the state its output SQNR
    was measured on (``calibration_runs.state_digest``; unknown for older runs)."""
    tables = set(db.table_names())
    if "calibration_runs" in tables and "state_digest" not in db["calibration_runs"].columns_dict:
        db["calibration_runs"].add_column("state_digest", str)
    create_lint_tables(db)


MIGRATIONS[3] = _migrate_3_to_4


def _migrate_4_to_5(db: sqlite_utils.Database) -> None:
    """Version 5 adds per-layer smoothing (``smoothing``: SmoothQuant and AWQ scales); nothing else changes."""
    create_smoothing_tables(db)


MIGRATIONS[4] = _migrate_4_to_5


def _upgrade_existing(db: sqlite_utils.Database) -> None:
    """Migrate a project file being overwritten, so that its tables take the current rows."""
    if "meta" not in db.table_names():
        return
    row = next(db["meta"].rows_where("key = ?", ["schema_version"]), None)
    try:
        version = int(row["value"]) if row is not None else SCHEMA_VERSION
    except (TypeError, ValueError):
        return
    migrate(db, version)


def migrate(db: sqlite_utils.Database, version: int) -> bool:
    """Upgrade ``db`` from format ``version`` to :data:`SCHEMA_VERSION`, one step at a time, stamping the
    format after each step. False (with the steps that exist applied) when a step is missing."""
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            return False
        MIGRATIONS[version](db)
        version += 1
        if "meta" in db.table_names():
            db["meta"].upsert({"key": "schema_version", "value": str(version)}, pk="key")
    return True
