"""Fuzzing helpers shared by the project-file tests (imported by name: tests/project is on sys.path)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from hypothesis import strategies as st

from workbench.project import ProjectError, load_project

# valid SQLite values that are wrong for most columns
STRANGE_VALUES = st.one_of(st.none(), st.integers(-2 ** 63, 2 ** 63 - 1), st.text(max_size=20),
                           st.binary(max_size=20), st.just("{}"), st.just("[1, 2]"), st.just("null"))


def tamper(path: Path, *statements: str) -> None:
    """Change a saved project file behind the store's back, as another program or a bad disk would."""
    connection = sqlite3.connect(path)
    for statement in statements:
        connection.execute(statement)
    connection.commit()
    connection.close()


def load_with_every_column_set(path: Path, table: str, value: object) -> None:
    """Set every column of ``table`` to ``value`` (where SQLite allows it), then open the project:
    a clean ProjectError is fine, any other exception fails the test."""
    connection = sqlite3.connect(path)
    for column in [row[1] for row in connection.execute(f"PRAGMA table_info([{table}])")]:
        try:
            connection.execute(f"UPDATE [{table}] SET [{column}] = ?", (value,))
        except sqlite3.IntegrityError:
            pass
    connection.commit()
    connection.close()
    try:
        load_project(path)
    except ProjectError:
        pass

