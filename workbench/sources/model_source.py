"""Model sources: where a project's float model comes from, and loading it with clear errors.

Five kinds:

``entrypoint``  ``path/to/file.py:factory`` or ``package.module:factory`` called with keyword
                arguments, plus optional weights (a state_dict in ``.pt``/``.pth``, loaded with
                ``weights_only=True``, or ``.safetensors``). Runs the user's code: needs trust.
``pickle``      a whole model saved with ``torch.save(model)`` (how yolov5 checkpoints come), with
                the folder of its code on the import path. Unpickling runs code: needs trust.
``demo``        the built-in models (``digits``, ``resnet18``, ``resnet50``, ``resnet18-tiny``).
``hf``          ``hf:DIR``: a local Hugging Face model folder (``config.json`` + ``*.safetensors``), built
                by the installed ``transformers`` from the class its config names. No code from the
                folder runs (configs that need ``trust_remote_code`` are refused), so no trust is needed.
``timm``        ``timm:NAME[@weights.safetensors]``: a model of the installed ``timm`` package by name.
"""
from __future__ import annotations

import difflib
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench import bounded_json
from workbench.quant.algorithms.distributed import launched_by_torchrun
from workbench.quant.algorithms.residency import AllResident, BlockResidency
from workbench.sources import demo
from workbench.sources.digest_cache import cached_sha256
from workbench.sources.entrypoints import extra_import_path, is_file_target, load_entrypoint, split_entrypoint
from workbench.sources.errors import SourceError, TrustRequired
from workbench.sources.input_dtype import cast_float_inputs
from workbench.sources.lazy_checkpoint import LazyCheckpoint, build_on_meta, move_keeping_meta
from workbench.sources.paths import absolute_entrypoint, absolute_path, relative_entrypoint, relative_path
from workbench.sources.weights_file import load_weights

__all__ = ["ModelSpec", "LoadedModel", "FileDigest", "load_model", "sha256_of", "DEMO_MODELS", "MODEL_KINDS"]

logger = logging.getLogger(__name__)

MODEL_KINDS = ("entrypoint", "pickle", "demo", "hf", "timm")
# kinds named on the command line by a prefix: "demo:digits", "hf:models/bert", "timm:resnet18"
_PREFIXED_KINDS = ("demo", "hf", "timm")
DEMO_MODELS = ("digits", "resnet18", "resnet50", "resnet18-tiny")
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


@dataclass
class ModelSpec:
    """Where the float model comes from (plain data: saved in the project as JSON)."""

    kind: str
    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    weights: str | None = None
    code_dir: str | None = None  # pickles: the folder holding the code the pickle refers to

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise SourceError(f"model kind must be one of {MODEL_KINDS}, got {self.kind!r}.")
        if not isinstance(self.target, str) or not self.target:
            raise SourceError("a model source needs a target (entry point, file or demo name).")
        if not isinstance(self.kwargs, dict):
            raise SourceError(f"model keyword arguments must be a mapping, got {type(self.kwargs).__name__}.")
        if self.kind == "demo" and self.target not in DEMO_MODELS:
            raise SourceError(f"unknown demo model {self.target!r}; choose one of {DEMO_MODELS}.")
        if self.kind == "entrypoint":
            split_entrypoint(self.target)

    @classmethod
    def parse(cls, text: str, weights: str | None = None, kwargs: dict[str, Any] | None = None,
              code_dir: str | None = None) -> ModelSpec:
        """From the command line: ``demo:digits``, ``hf:DIR``, ``timm:NAME[@weights]``, ``file.py:factory``,
        ``pkg.mod:factory`` or ``model.pt``."""
        for kind in _PREFIXED_KINDS:
            if text.startswith(kind + ":"):
                target = text[len(kind) + 1:]
                if kind == "timm" and "@" in target:
                    target, named_weights = target.split("@", 1)
                    if weights and weights != named_weights:
                        raise SourceError(f"{text} names weights {named_weights} and --weights {weights}: give one.")
                    weights = named_weights
                return cls(kind, target, kwargs or {}, weights)
        if text.endswith((".pt", ".pth")) and ":" not in Path(text).name:
            return cls("pickle", text, kwargs or {}, weights, code_dir)
        return cls("entrypoint", text, kwargs or {}, weights)

    @property
    def requires_trust(self) -> bool:
        """Loading it runs code from outside Quant Workbench and its installed libraries: a factory or a
        pickle (a Hugging Face folder gives only a config and tensors; timm builds from its own code)."""
        return self.kind not in ("demo", "hf", "timm")

    @property
    def label(self) -> str:
        text = f"{self.kind}:{self.target}" if self.kind in _PREFIXED_KINDS else self.target
        return text + (f" + {self.weights}" if self.weights else "")

    def files(self, base_dir: Path | None = None) -> list[Path]:
        """The files this source reads (to fingerprint them)."""
        paths = []
        if self.kind == "pickle":
            paths.append(_resolve(self.target, base_dir))
        elif self.kind == "entrypoint":
            target, _ = split_entrypoint(self.target)
            if is_file_target(target):
                paths.append(_resolve(target, base_dir))
        elif self.kind == "demo" and self.target == "digits":
            paths.append(demo.DIGITS_WEIGHTS)
        elif self.kind == "hf":
            folder = _resolve(self.target, base_dir)
            if folder.is_dir():
                paths += [folder / "config.json"] + sorted(folder.glob("*.safetensors"))
        if self.weights:
            paths.append(_resolve(self.weights, base_dir))
        return paths

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "kwargs": self.kwargs, "weights": self.weights,
                "code_dir": self.code_dir}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        if not isinstance(data, dict):
            raise SourceError("model source must be a mapping.")
        return cls(str(data.get("kind")), str(data.get("target")), dict(data.get("kwargs") or {}),
                   data.get("weights"), data.get("code_dir"))

    def relative_to(self, base_dir: Path) -> ModelSpec:
        """The same spec with file paths written relative to ``base_dir`` where they lie under it."""
        return self._with_paths(relative_path, relative_entrypoint, base_dir)

    def absolute(self, base_dir: Path) -> ModelSpec:
        """The same spec with relative file paths resolved against ``base_dir`` (the project's folder)."""
        return self._with_paths(absolute_path, absolute_entrypoint, base_dir)

    def _with_paths(self, plain: Callable[[str | None, Path], str | None], entrypoint: Callable[[str, Path], str],
                    base_dir: Path) -> ModelSpec:
        target = self.target
        if self.kind in ("pickle", "hf"):
            target = plain(target, base_dir) or target
        elif self.kind == "entrypoint":
            target = entrypoint(target, base_dir)
        return ModelSpec(self.kind, target, dict(self.kwargs), plain(self.weights, base_dir),
                         plain(self.code_dir, base_dir))


@dataclass(frozen=True)
class FileDigest:
    path: str
    sha256: str
    size: int


@dataclass
class LoadedModel:
    model: nn.Module
    spec: ModelSpec
    digests: list[FileDigest]
    parameters: int
    # an hf: checkpoint opened without reading its weights (they are on meta until loaded); None: all in memory
    checkpoint: LazyCheckpoint | None = None

    def describe(self) -> str:
        return f"{type(self.model).__name__} from {self.spec.label} ({self.parameters:,} parameters)"

    @property
    def residency(self) -> BlockResidency:
        """Loads and releases the model's weights block by block (does nothing when they are all in memory)."""
        return self.checkpoint if self.checkpoint is not None else AllResident()

    def materialise(self) -> None:
        """Every weight in memory (a job that needs the whole model calls this first; nothing to do when eager). In a
        process of a multi-process job the weights are mapped from the checkpoint, one copy for all the ranks of a
        machine (:meth:`LazyCheckpoint.materialise`)."""
        if self.checkpoint is not None:
            self.checkpoint.materialise(self.model, mapped=launched_by_torchrun())

    def to(self, device: torch.device) -> None:
        """Move the model to ``device``; weights still on meta are read straight onto it when loaded."""
        if self.checkpoint is None:
            self.model.to(device)
            return
        self.checkpoint.device = torch.device(device)
        move_keeping_meta(self.model, self.checkpoint.device)


def sha256_of(path: Path) -> FileDigest:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return FileDigest(str(path), digest.hexdigest(), path.stat().st_size)


def _resolve(value: str, base_dir: Path | None) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path


def load_model(spec: ModelSpec, *, trust_code: bool = False, base_dir: Path | None = None,
               lazy: bool = False) -> LoadedModel:
    """Build the float model described by ``spec``, in eval mode, with its weights loaded.

    With ``lazy`` an ``hf:`` safetensors folder keeps its weights on meta (``LoadedModel.checkpoint`` reads them
    when they are needed); without, they are all read before it returns (still never held twice).

    Raises:
        TrustRequired: the source runs code and ``trust_code`` is False.
        SourceError: a file is missing, the target is not a model, the factory raised, or the weights
            do not fit (missing/unexpected keys and shape mismatches are listed).
    """
    if spec.requires_trust:  # fail closed: a kind this code does not know is refused untrusted too
        _require_trust(spec, trust_code)
    checkpoint = None
    if spec.kind == "demo":
        model = _demo_model(spec.target)
    elif spec.kind == "entrypoint":
        model = _from_entrypoint(spec, base_dir, trust_code)
    elif spec.kind == "pickle":
        model = _from_pickle(spec, base_dir, trust_code)
    elif spec.kind == "hf":
        model, checkpoint = _from_hugging_face(spec, base_dir)
    elif spec.kind == "timm":
        model = _from_timm(spec)
    else:  # never unpickle by default: a kind this code does not know is refused
        raise SourceError(f"model kind must be one of {MODEL_KINDS}, got {spec.kind!r}.")
    if checkpoint is not None and not lazy:
        checkpoint.materialise(model)
        checkpoint = None
    if spec.weights:
        load_weights(model, _resolve(spec.weights, base_dir))
    model.eval()
    cast_float_inputs(model)  # a bf16/fp16 model stays in its dtype and takes float32 data
    # remembered per version of each file: a 7B checkpoint is not hashed again at every open
    digests = [FileDigest(str(path), cached_sha256(path, lambda p: sha256_of(p).sha256), path.stat().st_size)
               for path in spec.files(base_dir) if path.is_file()]
    return LoadedModel(model, spec, digests, sum(p.numel() for p in model.parameters()), checkpoint)


def _demo_model(name: str) -> nn.Module:
    if name == "digits":
        return demo.load_digits_cnn()
    if name == "resnet18":
        return demo.resnet18_like()
    if name == "resnet50":
        return demo.resnet50_like()
    return demo.resnet18_like(num_classes=10, width=8)


def _from_hugging_face(spec: ModelSpec, base_dir: Path | None) -> tuple[nn.Module, LazyCheckpoint | None]:
    """A local Hugging Face folder, built by transformers from the architecture its config names, weights
    from safetensors only, never with remote code.

    Opened lazily (:mod:`workbench.sources.lazy_checkpoint`: the tree on meta, the checkpoint returned to read the
    weights from) when it can be: accelerate is installed, no separate weights file, and the checkpoint names
    the model's weights as the model does; otherwise transformers' ``from_pretrained`` loads it all (None)."""
    folder = _resolve(spec.target, base_dir)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise SourceError(f"{folder}: not a Hugging Face model folder (no config.json); save one with "
                          "model.save_pretrained(folder).")
    try:
        config_data = bounded_json.read_json_file(config_path)
    except (OSError, ValueError) as error:
        raise SourceError(f"{config_path}: not a readable JSON config ({error}).") from error
    if not isinstance(config_data, dict):
        raise SourceError(f"{config_path}: the config is not a JSON object.")
    if config_data.get("auto_map"):
        raise SourceError(f"{folder}: its config needs the folder's own Python code (auto_map: "
                          f"{sorted(config_data['auto_map'])}), which Quant Workbench does not run for hf: models. "
                          "Use an entry point that builds the model (it asks for your trust) instead.")
    if not list(folder.glob("*.safetensors")):
        raise SourceError(f"{folder}: no *.safetensors weights (only safetensors are read, pickled .bin files are "
                          "not); save with model.save_pretrained(folder, safe_serialization=True).")
    transformers = _import_optional("transformers", "hf", spec)
    architectures = config_data.get("architectures") or []
    model_class = getattr(transformers, architectures[0], None) if architectures else None
    if model_class is None:
        model_class = transformers.AutoModel
    if _lazy_possible(spec, folder):
        lazy = _lazy_hugging_face(spec, folder, transformers, model_class)
        if lazy is not None:
            return lazy
    hf_logging = transformers.utils.logging
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Loading weights" bar would interleave with our own progress
    try:
        model = model_class.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                            use_safetensors=True, **spec.kwargs)
    except Exception as error:
        raise SourceError(f"{folder}: transformers could not build {model_class.__name__} from it "
                          f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}).") from error
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    if not isinstance(model, nn.Module):
        raise SourceError(f"{folder}: {model_class.__name__} gave a {type(model).__name__}, not a torch.nn.Module.")
    return model, None  # in the dtype the folder was saved in (bf16 stays bf16: no float32 copy beside it)


# from_pretrained keyword arguments that building from the config takes the same way
_LAZY_KWARGS = {"attn_implementation", "dtype", "torch_dtype"}
# checkpoints from this size open lazily by default: below it a model's weights cost less than the open itself, and
# transformers' own load covers every architecture's quirks (key renaming, ties made at load time)
LAZY_OPEN_BYTES = 512 * 1024 ** 2
# "auto" (by size), "always" or "never"
LAZY_OPEN_VARIABLE = "WORKBENCH_LAZY_OPEN"
LAZY_OPEN_MODES = ("auto", "always", "never")


def _lazy_possible(spec: ModelSpec, folder: Path) -> bool:
    import importlib.util

    if spec.weights or not set(spec.kwargs) <= _LAZY_KWARGS or importlib.util.find_spec("accelerate") is None:
        return False
    mode = os.environ.get(LAZY_OPEN_VARIABLE, "auto").strip().lower() or "auto"
    if mode not in LAZY_OPEN_MODES:
        raise SourceError(f"{LAZY_OPEN_VARIABLE}={os.environ[LAZY_OPEN_VARIABLE]!r}: expected one of "
                          f"{', '.join(LAZY_OPEN_MODES)}.")
    if mode != "auto":
        return mode == "always"
    return sum(path.stat().st_size for path in folder.glob("*.safetensors")) >= LAZY_OPEN_BYTES


def _lazy_hugging_face(spec: ModelSpec, folder: Path, transformers: Any,
                       model_class: Any) -> tuple[nn.Module, LazyCheckpoint] | None:
    """The model on meta and its checkpoint, or None when the checkpoint names its weights otherwise (transformers'
    renaming is needed: the eager load does it)."""
    checkpoint = LazyCheckpoint(folder)  # a missing or corrupt shard is an error here, as it is eagerly
    kwargs = dict(spec.kwargs)
    dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        dtype = _dtype_named(dtype) or _dtype_named(getattr(config, "dtype", None)) or checkpoint.float_dtype()
        model = build_on_meta(model_class, config, dtype, **kwargs)
    except Exception as error:
        raise SourceError(f"{folder}: transformers could not build {model_class.__name__} from its config "
                          f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}).") from error
    if not checkpoint.covers(model):
        logger.info("%s: the checkpoint names its weights otherwise than %s; loading them all with transformers",
                    folder, type(model).__name__)
        return None
    checkpoint.attach(model)
    return model, checkpoint


def _dtype_named(value: Any) -> torch.dtype | None:
    if isinstance(value, torch.dtype):
        return value
    return getattr(torch, value, None) if isinstance(value, str) and value != "auto" else None


def _from_timm(spec: ModelSpec) -> nn.Module:
    timm = _import_optional("timm", "timm", spec)
    known = timm.list_models()
    if spec.target not in known:
        close = difflib.get_close_matches(spec.target, known, n=5)
        raise SourceError(f"timm has no model {spec.target!r}" + (f"; did you mean {', '.join(close)}?" if close
                                                                   else "."))
    try:
        return timm.create_model(spec.target, pretrained=False, **spec.kwargs)
    except Exception as error:
        raise SourceError(f"timm could not build {spec.target} ({type(error).__name__}: {error}).") from error


def _import_optional(module: str, extra: str, spec: ModelSpec) -> Any:
    """An optional library, or a SourceError that says why it cannot be imported and how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as error:  # not installed, or installed but broken (timm without a working torchvision)
        raise SourceError(f"{spec.label} needs the {module} package, which cannot be imported here "
                          f"({type(error).__name__}: {error}). Install it with scripts/setup-env.sh "
                          f"(WORKBENCH_EXTRAS={extra}) or pip install 'quant-workbench[{extra}]' with a constraint "
                          "that keeps your torch.") from error


def _require_trust(spec: ModelSpec, trust_code: bool) -> None:
    """Checked by load_model and again right where code runs (importing a factory, unpickling), so no
    other path reaches them untrusted."""
    if not trust_code:
        raise TrustRequired(f"Loading {spec.label} runs its Python code ({spec.kind}); only do this for code you "
                            "trust, then allow it (--trust-code on the command line).")


def _from_entrypoint(spec: ModelSpec, base_dir: Path | None, trust_code: bool) -> nn.Module:
    _require_trust(spec, trust_code)
    factory = load_entrypoint(spec.target, base_dir)
    if not callable(factory):
        raise SourceError(f"{spec.target} is not callable (it is a {type(factory).__name__}).")
    try:
        model = factory(**spec.kwargs)
    except Exception as error:
        raise SourceError(f"{spec.target} raised {type(error).__name__}: {error}") from error
    if not isinstance(model, nn.Module):
        raise SourceError(f"{spec.target} returned a {type(model).__name__}, not a torch.nn.Module.")
    return model


def _from_pickle(spec: ModelSpec, base_dir: Path | None, trust_code: bool) -> nn.Module:
    _require_trust(spec, trust_code)  # before the file is even looked at: a project file names it
    path = _resolve(spec.target, base_dir)
    if not path.is_file():
        raise SourceError(f"{path}: no such model file.")
    code_dir = _resolve(spec.code_dir, base_dir) if spec.code_dir else path.resolve().parent
    try:
        with extra_import_path(code_dir):
            # the user chose to trust this file (checked above): unpickling runs its code
            loaded = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise SourceError(f"{path}: cannot be loaded as a pickled model ({type(error).__name__}: {error}). If its "
                          f"code lives elsewhere, give that folder as the code directory.") from error
    if isinstance(loaded, dict):
        for key in ("model", "ema", "module", "net"):
            if isinstance(loaded.get(key), nn.Module):
                loaded = loaded[key]
                break
    if not isinstance(loaded, nn.Module):
        keys = f" (keys: {sorted(map(str, loaded))[:8]})" if isinstance(loaded, dict) else ""
        raise SourceError(f"{path}: holds a {type(loaded).__name__}{keys}, not a torch.nn.Module. A state_dict needs "
                          "the model's code: use an entry point with these weights.")
    return loaded  # in its own dtype: a bf16/fp16 model is not silently upcast
