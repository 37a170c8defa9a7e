"""Package faces that import their modules on first use (PEP 562), so that importing a package for one light
module (``workbench.export.naming``, ``workbench.project.errors``) does not load the heavy ones (onnx, torch,
sqlite-utils) its face also offers.

A package lists which module defines each public name; ``from workbench.export import export_qdq_onnx`` and
``workbench.export.export_qdq_onnx`` still work and give the same object, loaded when first asked for::

    __getattr__, __dir__, __all__ = lazy_face(__name__, {"workbench.export.onnx_export": ("export_qdq_onnx",)})
    if TYPE_CHECKING:  # what type checkers and editors read
        from workbench.export.onnx_export import export_qdq_onnx
"""
from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_face"]


def lazy_face(package: str, modules: Mapping[str, Iterable[str]]
              ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """The module-level ``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` whose public names
    (``modules``: defining module -> the names it gives the face) are imported when first used.

    A resolved name is stored in the package, so later uses cost nothing; a name the face does not offer
    raises AttributeError as usual (which also lets ``from package import submodule`` import the submodule).
    A public name that is also a submodule's (``workbench.analysis.sensitivity``, the function and its module)
    stays the public object: importing the submodule does not rebind it, as it could not when the face
    imported everything at once.
    """
    where = {name: module for module, names in modules.items() for name in names}
    public = list(where)
    sys.modules[package].__class__ = _face_module(package, frozenset(where))

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__, public


def _face_module(package: str, names: frozenset[str]) -> type[types.ModuleType]:
    """A module type for ``package`` that keeps its public ``names`` from being bound to same-named submodules
    (the import system binds ``package.x`` to the submodule ``package.x`` once it is imported)."""

    class FaceModule(types.ModuleType):
        def __setattr__(self, name: str, value: object) -> None:
            if name in names and isinstance(value, types.ModuleType) and value.__name__ == f"{package}.{name}":
                return  # the submodule stays reachable through sys.modules and ``from package.x import ...``
            super().__setattr__(name, value)

    return FaceModule
