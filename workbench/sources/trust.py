"""Trust remembered per project, as Jupyter does for notebooks.

A project can name code that runs when it is used: a model factory or a pickled model, a data entry
point, a metric or a loss function in a file. Running it needs the user's trust. Once given
(``--trust-code``, ``workbench trust``, or the GUI's question), the trust is recorded in the user's
config folder (``$XDG_CONFIG_HOME/quant-workbench/trust.json``, default ``~/.config/...``), keyed by
the project file's absolute path, with a sha256 over the code references and the files they run (an entry
point's file and, transitively, the local modules it imports: :mod:`workbench.sources.closure`). A
later command on the same file with the same code runs without asking; a change to any of that code,
or the project copied elsewhere, asks again. Reading the references runs nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workbench import bounded_json
from workbench.sources.closure import module_closure
from workbench.sources.data_source import DataSpec
from workbench.sources.entrypoints import is_file_target, split_entrypoint
from workbench.sources.errors import SourceError
from workbench.sources.model_source import ModelSpec

__all__ = ["CodeReference", "code_references", "code_fingerprint", "trust_store_path", "trust_status",
           "remember_trust", "forget_trust", "changed_code_files", "TRUSTED", "CHANGED", "UNKNOWN"]

TRUSTED, CHANGED, UNKNOWN = "trusted", "changed", "unknown"
_STORE_VERSION = 1


@dataclass(frozen=True)
class CodeReference:
    """One piece of code a project runs: what uses it, as the project names it, the files it runs and why
    it needs trust."""

    role: str                # "model", "calibration data", "metric", "loss", ...
    spec: str                # as the project names it (an entry point, a pickle file)
    files: tuple[str, ...]   # the files it runs, absolute (those that exist)
    why: str
    # what the trust does not cover: imports with computed names, code run with exec/runpy (see closure.py);
    # installed packages are never covered (they are not the project's code)
    not_covered: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "spec": self.spec, "files": list(self.files), "why": self.why,
                "not_covered": list(self.not_covered)}


def _resolve(value: str, base_dir: Path) -> Path:
    path = Path(value).expanduser()
    return (path if path.is_absolute() else base_dir / path).resolve()


def _entrypoint_file(spec: str, base_dir: Path) -> tuple[Path | None, Path]:
    """The file an entry point imports (its ``.py`` file, or a module's source found under ``base_dir``; None
    for a module installed elsewhere: finding it would import its package) and the folder it is imported from."""
    target, _ = split_entrypoint(spec)
    if is_file_target(target):
        path = _resolve(target, base_dir)
        return path, path.parent
    relative = Path(*target.split("."))
    for candidate in (base_dir / relative.with_suffix(".py"), base_dir / relative / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve(), base_dir
    return None, base_dir


def _entrypoint_reference(role: str, spec: str, base_dir: Path) -> CodeReference:
    """The entry point's file and every local module it imports (hashed with it: an edit to a helper the
    trusted file imports asks again), with what reading the imports could not follow."""
    entry, folder = _entrypoint_file(spec, base_dir)
    if entry is None:
        return CodeReference(role, spec, (), f"importing {spec.rpartition(':')[0]} runs its code")
    closure = module_closure(entry, [folder, base_dir])
    files = tuple(str(f) for f in closure.files if f == entry or f.is_file())
    helpers = [Path(f).name for f in files[1:]]
    why = f"importing {entry.name} runs its code"
    if helpers:
        why += f" and the local modules it imports ({', '.join(helpers[:5])}{', ...' if len(helpers) > 5 else ''})"
    return CodeReference(role, spec, files, why, tuple(closure.not_covered))


def code_references(model: ModelSpec, data: Mapping[str, DataSpec], settings: Mapping[str, Any],
                    base_dir: Path) -> list[CodeReference]:
    """Every piece of code a project with these sources and settings runs, without running any of it.

    ``settings`` are the project's (a ``metric`` or a fine-tuning ``loss`` may name an entry point);
    relative paths are relative to ``base_dir``, the project's folder.
    """
    base_dir = Path(base_dir).resolve()
    references: list[CodeReference] = []
    if model.kind == "entrypoint":
        references.append(_entrypoint_reference("model", model.target, base_dir))
    elif model.requires_trust:  # a pickle, or a kind this code does not know: fail closed
        files = [_resolve(model.target, base_dir)]
        if model.code_dir:
            code_dir = _resolve(model.code_dir, base_dir)
            files += sorted(code_dir.rglob("*.py")) if code_dir.is_dir() else []
        references.append(CodeReference("model", model.target, tuple(str(f) for f in files),
                                        "unpickling a model runs the code it refers to"))
    for role, spec in data.items():
        if spec.requires_trust:
            references.append(_entrypoint_reference(f"{role} data", spec.path, base_dir))
    for key, field_name, role in (("metric", "name", "metric"), ("finetune", "loss", "loss")):
        value = (settings.get(key) or {}).get(field_name) if isinstance(settings.get(key), Mapping) else None
        if isinstance(value, str) and ":" in value:
            try:
                references.append(_entrypoint_reference(role, value, base_dir))
            except SourceError:  # not an entry point's form: nothing runs
                continue
    return references


def _file_digest(path: Path) -> str:
    if not path.is_file():
        return "missing"
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def changed_code_files(project_path: str | os.PathLike, references: list[CodeReference]) -> list[str]:
    """The files (of ``references``) that differ from when the project's trust was recorded: new ones
    (a module a trusted file imports since) and changed ones. [] when nothing is recorded per file."""
    record = _read_store().get(_key(project_path))
    recorded = record.get("files") if isinstance(record, dict) else None
    if not isinstance(recorded, dict):
        return []
    return [name for r in references for name in r.files if recorded.get(name) != _file_digest(Path(name))]


def code_fingerprint(references: list[CodeReference]) -> str:
    """sha256 over the references (role and spec) and the bytes of every file they run; a missing file
    counts as missing, so it appearing later changes the fingerprint."""
    digest = hashlib.sha256()
    for reference in references:
        digest.update(f"{reference.role}\0{reference.spec}\0".encode())
        for name in reference.files:
            path = Path(name)
            digest.update(f"{name}\0".encode())
            if path.is_file():
                with open(path, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
            else:
                digest.update(b"\0missing\0")
    return digest.hexdigest()


def trust_store_path() -> Path:
    """``$XDG_CONFIG_HOME/quant-workbench/trust.json`` (``~/.config/quant-workbench/trust.json`` without it)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "quant-workbench" / "trust.json"


def _key(project_path: str | os.PathLike) -> str:
    return str(Path(project_path).expanduser().resolve())


def _read_store() -> dict[str, Any]:
    path = trust_store_path()
    try:
        data = bounded_json.read_json_file(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):  # unreadable or damaged: trust nothing, ask again
        return {}
    projects = data.get("projects") if isinstance(data, dict) else None
    return projects if isinstance(projects, dict) else {}


def _write_store(projects: dict[str, Any]) -> None:
    path = trust_store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".trust.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"version": _STORE_VERSION, "projects": projects}, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)  # mode 0600 from mkstemp: what a user trusts is their own business
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def trust_status(project_path: str | os.PathLike, references: list[CodeReference]) -> str:
    """:data:`TRUSTED` (this file's code as it is now was trusted), :data:`CHANGED` (it was trusted, but the
    code or its references changed since) or :data:`UNKNOWN` (never trusted here; a copy of a trusted
    project is a new file)."""
    record = _read_store().get(_key(project_path))
    if not isinstance(record, dict):
        return UNKNOWN
    return TRUSTED if record.get("sha256") == code_fingerprint(references) else CHANGED


def remember_trust(project_path: str | os.PathLike, references: list[CodeReference]) -> Path:
    """Record that the user trusts the code ``references`` name, as it is now, for this project file.
    Returns the store's path."""
    projects = _read_store()
    projects[_key(project_path)] = {"sha256": code_fingerprint(references),
                                    "trusted": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "references": [r.to_dict() for r in references],
                                    # per file, so that a later refusal can name the file that changed
                                    "files": {name: _file_digest(Path(name)) for r in references for name in r.files}}
    _write_store(projects)
    return trust_store_path()


def forget_trust(project_path: str | os.PathLike) -> bool:
    """Forget the trust recorded for a project file; False if there was none."""
    projects = _read_store()
    if projects.pop(_key(project_path), None) is None:
        return False
    _write_store(projects)
    return True
