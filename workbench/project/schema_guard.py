"""What a project file may hold: the tables the workbench creates, and nothing else.

SQLite files can carry code: a trigger runs SQL on every insert or delete (a save deletes and inserts
every row), a view runs a query when read, and a generated column or a default computes values. A
project file is data, so every schema object is compared with the schema :func:`create_schema` makes;
anything else (a trigger, a view, an index, a table or column of its own) makes the file refused on
open and on save, before any row is read or written, with the objects named.
"""
from __future__ import annotations

import functools
import sqlite3
from pathlib import Path

import sqlite_utils

from workbench.project.errors import ProjectError
from workbench.project.tables import create_schema

__all__ = ["foreign_objects", "check_schema_objects"]

# objects SQLite makes itself (primary-key indexes, ANALYZE's statistics): data only, never code
_SQLITE_OWN = ("sqlite_autoindex_", "sqlite_stat", "sqlite_sequence")


@functools.cache
def _expected() -> dict[str, tuple[str, dict[str, tuple[int, object]]]]:
    """name -> (type, {column: (hidden, default)}) of every object of the current schema."""
    db = sqlite_utils.Database(sqlite3.connect(":memory:"))
    try:
        create_schema(db)
        return {name: (kind, _columns(db, name) if kind == "table" else {})
                for kind, name in db.execute("SELECT type, name FROM sqlite_master")}
    finally:
        db.close()


def _columns(db: sqlite_utils.Database, table: str) -> dict[str, tuple[int, object]]:
    # table_xinfo lists generated (hidden 2, 3) columns too, which table_info leaves out
    return {row[1]: (row[6], row[4]) for row in db.execute(f"PRAGMA table_xinfo([{table}])")}


def foreign_objects(db: sqlite_utils.Database) -> list[str]:
    """The schema objects in ``db`` that the workbench did not create, as "trigger 'x' on layers" etc.

    Tables and columns of older formats (a subset of the current ones) are not foreign; a column the
    current schema lacks, or one whose value SQLite computes (a default or a generated column), is.
    """
    expected = _expected()
    found: list[str] = []
    rows = db.execute("SELECT type, name, tbl_name FROM sqlite_master ORDER BY type, name").fetchall()
    for kind, name, table in rows:
        if str(name).startswith(_SQLITE_OWN):
            continue
        want = expected.get(name)
        if want is None or want[0] != kind:
            found.append(f"{kind} {name!r}" + (f" on table {table!r}" if kind in ("trigger", "index") else ""))
            continue
        if kind == "table":
            reference = want[1]
            for column, (hidden, default) in _columns(db, name).items():
                if column not in reference:
                    found.append(f"column {column!r} of table {name!r}")
                elif (hidden, default) != reference[column]:
                    found.append(f"column {column!r} of table {name!r} (computed by SQLite)")
    return found


def check_schema_objects(db: sqlite_utils.Database, path: Path) -> None:
    """Refuse a project file holding schema objects the workbench did not create.

    Raises:
        ProjectError: naming the objects, and how to remove them.
    """
    found = foreign_objects(db)
    if not found:
        return
    shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
    raise ProjectError(f"{path}: holds schema objects Quant Workbench does not create ({shown}). A project file "
                       "carries data only: triggers, views and other objects could run SQL when the project is "
                       "saved, so it was neither opened nor changed. Remove them (e.g. `sqlite3 FILE \"DROP "
                       "TRIGGER name\"`) or use a copy of the project that does not have them.")
