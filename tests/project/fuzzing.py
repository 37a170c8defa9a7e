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



def mutate(content: bytes, data) -> bytes:
    """Flip, overwrite, cut or extend bytes of ``content`` as a bad disk, a bad copy or a bad download would
    (``data`` is hypothesis's ``st.data()``): 1 to 6 changes."""
    content = bytearray(content)
    for _ in range(data.draw(st.integers(1, 6))):
        action = data.draw(st.sampled_from(["flip", "overwrite", "truncate", "append"]))
        if action == "flip" and content:
            index = data.draw(st.integers(0, len(content) - 1))
            content[index] ^= data.draw(st.integers(1, 255))
        elif action == "overwrite" and content:
            index = data.draw(st.integers(0, len(content) - 1))
            chunk = data.draw(st.binary(min_size=1, max_size=64))
            content[index:index + len(chunk)] = chunk
        elif action == "truncate":
            content = content[:data.draw(st.integers(0, len(content)))]
        else:
            content += data.draw(st.binary(min_size=1, max_size=256))
    return bytes(content)
