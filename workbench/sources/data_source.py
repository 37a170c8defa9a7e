"""Data sources: sample inputs for calibration and evaluation, batched, with labels where known.

Kinds: a folder of images (recursive; jpg/png/bmp, read with Pillow: resize, center crop, normalise;
labels from sub-folder names), tensor files (``.npy``, ``.npz``, ``.safetensors``, ``.pt`` holding
tensors only), a Python entry point returning an iterable of batches (needs trust), and the demo
digits data. Batches are ``(inputs, labels)`` tuples, ``labels`` being None when unknown.

``inputs`` is one tensor (the model's positional input) or, for models fed by keyword (token ids and
their masks), a dict ``{argument name: tensor}``: a tensor file holding several arrays none of which is
named like a single input (``input_ids``, ``attention_mask``, ``token_type_ids``...), or an entry point
yielding dicts. Integer data (token ids) keeps its integer dtype; only floating data becomes float32.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.sources import demo
from workbench.sources.entrypoints import load_entrypoint, split_entrypoint
from workbench.sources.errors import SourceError, TrustRequired, mixed_sizes_message, unreadable_reason
from workbench.sources.npy_folder import is_npy_folder, stack_npy_folder
from workbench.sources.paths import absolute_entrypoint, absolute_path, relative_entrypoint, relative_path

__all__ = ["DataSpec", "ImageOptions", "DataSource", "open_data", "DATA_KINDS", "IMAGE_SUFFIXES", "InputSpec"]

DATA_KINDS = ("images", "tensors", "entrypoint", "demo")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
TENSOR_SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".pth")
INPUT_KEYS = ("inputs", "input", "x", "images", "data")
LABEL_KEYS = ("labels", "label", "y", "targets", "target")

Inputs = "torch.Tensor | dict[str, torch.Tensor]"
Batch = tuple[Inputs, "torch.Tensor | None"]


@dataclass
class ImageOptions:
    """How images become tensors: resize the shorter side, center crop, normalise per channel."""

    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    grayscale: bool = False

    def __post_init__(self) -> None:
        for name in ("resize", "crop"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise SourceError(f"image {name} must be a positive integer, got {value!r}.")
        channels = 1 if self.grayscale else 3
        self.mean = tuple(float(v) for v in self.mean)
        self.std = tuple(float(v) for v in self.std)
        if len(self.mean) not in (1, channels) or len(self.std) not in (1, channels):
            raise SourceError(f"image mean and std need 1 or {channels} values, got {len(self.mean)} and "
                              f"{len(self.std)}.")
        if any(s <= 0 for s in self.std):
            raise SourceError(f"image std values must be positive, got {self.std}.")


@dataclass
class DataSpec:
    """Where sample inputs come from and how they are batched (plain data: saved as JSON)."""

    kind: str
    path: str
    batch_size: int = 32
    num_batches: int | None = None
    shuffle: bool = False
    seed: int = 0
    split: str | None = None  # demo data: "train" or "test"
    image: ImageOptions | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise SourceError(f"data kind must be one of {DATA_KINDS}, got {self.kind!r}.")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise SourceError(f"batch size must be a positive integer, got {self.batch_size!r}.")
        if self.num_batches is not None and (isinstance(self.num_batches, bool) or not isinstance(self.num_batches, int)
                                             or self.num_batches < 1):
            raise SourceError(f"number of batches must be a positive integer or unlimited, got {self.num_batches!r}.")
        if self.kind == "demo":
            if self.path != "digits":
                raise SourceError(f"unknown demo data {self.path!r}; the demo data is 'digits'.")
            if self.split not in ("train", "test"):
                raise SourceError(f"demo data split must be 'train' or 'test', got {self.split!r}.")
        if self.kind == "entrypoint":
            split_entrypoint(self.path)
        if isinstance(self.image, dict):
            self.image = ImageOptions(**self.image)

    @classmethod
    def parse(cls, text: str, **options: Any) -> DataSpec:
        """From the command line: ``demo:digits[:test]``, a folder of images, a tensor file or an entry point."""
        if text.startswith("demo:"):
            parts = text.split(":")
            return cls("demo", parts[1], split=parts[2] if len(parts) > 2 else "train", **options)
        path = Path(text)
        if path.suffix.lower() in TENSOR_SUFFIXES or is_npy_folder(path):
            return cls("tensors", text, **options)
        if ":" in path.name:
            return cls("entrypoint", text, **options)
        return cls("images", text, **options)

    @property
    def requires_trust(self) -> bool:
        return self.kind == "entrypoint"

    @property
    def label(self) -> str:
        return f"demo:{self.path}:{self.split}" if self.kind == "demo" else self.path

    def to_dict(self) -> dict[str, Any]:
        data = {"kind": self.kind, "path": self.path, "batch_size": self.batch_size, "num_batches": self.num_batches,
                "shuffle": self.shuffle, "seed": self.seed, "split": self.split, "kwargs": self.kwargs}
        data["image"] = None if self.image is None else {
            "resize": self.image.resize, "crop": self.image.crop, "mean": list(self.image.mean),
            "std": list(self.image.std), "grayscale": self.image.grayscale}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataSpec:
        if not isinstance(data, dict):
            raise SourceError("data source must be a mapping.")
        known = {"kind", "path", "batch_size", "num_batches", "shuffle", "seed", "split", "image", "kwargs"}
        return cls(**{k: v for k, v in data.items() if k in known})

    def relative_to(self, base_dir: Path) -> DataSpec:
        """The same spec with its file path (a folder, a tensor file, an entry point's file) written relative
        to ``base_dir`` where it lies under it."""
        return self._with_path(relative_path, relative_entrypoint, base_dir)

    def absolute(self, base_dir: Path) -> DataSpec:
        """The same spec with a relative file path resolved against ``base_dir`` (the project's folder)."""
        return self._with_path(absolute_path, absolute_entrypoint, base_dir)

    def _with_path(self, plain: Callable[[str, Path], str | None], entrypoint: Callable[[str, Path], str],
                   base_dir: Path) -> DataSpec:
        copy = DataSpec.from_dict(self.to_dict())
        if self.kind in ("images", "tensors"):
            copy.path = plain(self.path, base_dir) or self.path
        elif self.kind == "entrypoint":
            copy.path = entrypoint(self.path, base_dir)
        return copy  # demo data names no file


@dataclass(frozen=True)
class InputSpec:
    """What the model is fed: per-sample shape (without the batch dimension) and dtype.

    A model fed by keyword (``input_ids``, ``attention_mask``...) has ``named``: ``{argument: (shape,
    dtype)}`` in the order the data gives them; ``shape`` and ``dtype`` are then the first one's.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    named: tuple[tuple[str, tuple[int, ...], str], ...] = ()

    @classmethod
    def of(cls, inputs: Any) -> InputSpec:
        """The spec of one batch's inputs (a tensor, or a dict of tensors by argument name)."""
        if isinstance(inputs, Mapping):
            named = tuple((str(k), tuple(v.shape[1:]), _dtype_name(v)) for k, v in inputs.items())
            if not named:
                raise SourceError("the data gives an empty dict of inputs.")
            return cls(named[0][1], named[0][2], named)
        return cls(tuple(inputs.shape[1:]), _dtype_name(inputs))

    @property
    def is_integer(self) -> bool:
        """Token ids and the like: an integer (or bool) input, which gets no float normalisation."""
        return not self.dtype.startswith(("float", "bfloat", "complex"))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.named:
            data["named"] = [[name, list(shape), dtype] for name, shape, dtype in self.named]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputSpec:
        named = tuple((str(n), tuple(int(s) for s in shape), str(d)) for n, shape, d in data.get("named") or ())
        return cls(tuple(int(s) for s in data["shape"]), str(data.get("dtype", "float32")), named)

    @staticmethod
    def parse_shape(text: str | None) -> tuple[int, ...] | None:
        """``"3,224,224"``, ``"3x224x224"`` or ``"(3, 224, 224)"`` -> ``(3, 224, 224)``; empty -> None.

        The shape is per sample (no batch dimension), as typed on the command line or in the wizard.

        Raises:
            SourceError: not integers, or not all positive.
        """
        text = (text or "").strip().strip("()[]")
        if not text:
            return None
        parts = [p for p in text.replace("x", ",").replace("×", ",").replace(" ", ",").split(",") if p]
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            raise SourceError(f"input shape must be integers such as 3,224,224 (without the batch), got "
                              f"{text!r}.") from None
        if not shape or any(s < 1 for s in shape):
            raise SourceError(f"input shape must be positive integers, got {text!r}.")
        return shape

    def with_batch(self, batch: int = 1) -> tuple[int, ...]:
        return (batch, *self.shape)

    def describe(self) -> str:
        if self.named:
            return ", ".join(f"{name} {tuple(shape)} {dtype}" for name, shape, dtype in self.named)
        return f"{tuple(self.shape)} {self.dtype}"


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


class DataSource:
    """An opened data source: ``batches()`` can be iterated any number of times."""

    def __init__(self, spec: DataSpec, base_dir: Path | None, trust_code: bool) -> None:
        if spec.requires_trust and not trust_code:
            raise TrustRequired(f"Data entry point {spec.path} runs Python code; only use it if you trust it, then "
                                "allow it (--trust-code on the command line).")
        self.spec = spec
        self.base_dir = base_dir
        self.classes: list[str] = []
        self._files: list[Path] = []
        self._labels: list[int] | None = None
        self._inputs: torch.Tensor | dict[str, torch.Tensor] | None = None
        self._targets: torch.Tensor | None = None
        if spec.kind == "images":
            self._index_images()
        elif spec.kind == "tensors":
            self._load_tensors()
        elif spec.kind == "demo":
            split = demo.load_digits_split(spec.split or "train")
            self._inputs, self._targets = split.images, split.labels
            self.classes = [str(i) for i in range(demo.DIGITS_CLASSES)]

    # ----- description ------------------------------------------------------------------------

    @property
    def num_samples(self) -> int | None:
        if self._files:
            return len(self._files)
        if self._inputs is not None:
            return int(_first_tensor(self._inputs).shape[0])
        return None

    @property
    def has_labels(self) -> bool:
        if self.spec.kind == "images":
            return self._labels is not None
        if self.spec.kind in ("tensors", "demo"):
            return self._targets is not None
        return False  # entry points: known once iterated

    @property
    def num_batches(self) -> int | None:
        count = None if self.num_samples is None else math.ceil(self.num_samples / self.spec.batch_size)
        if self.spec.num_batches is not None:
            count = self.spec.num_batches if count is None else min(count, self.spec.num_batches)
        return count

    def input_spec(self) -> InputSpec:
        """Per-sample input shape and dtype (of every keyword input), from the first batch."""
        try:
            inputs, _ = next(iter(self.batches(limit=1)))
        except StopIteration:
            raise SourceError(f"{self.spec.label}: the data gives no batch.") from None
        return InputSpec.of(inputs)

    def describe(self) -> str:
        parts = [f"{self.spec.kind} {self.spec.label}"]
        if self.num_samples is not None:
            parts.append(f"{self.num_samples} samples")
        if self.classes:
            parts.append(f"{len(self.classes)} classes")
        parts.append(f"batches of {self.spec.batch_size}")
        if self.num_batches is not None:
            parts.append(f"{self.num_batches} batches")
        return ", ".join(parts)

    # ----- iteration --------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    def __len__(self) -> int:
        count = self.num_batches
        if count is None:
            raise TypeError("this data source does not know its length until iterated")
        return count

    def batches(self, limit: int | None = None) -> Iterator[Batch]:
        """``(inputs, labels)`` batches, in a seeded shuffled order when asked, at most ``num_batches``."""
        maximum = self.spec.num_batches
        if limit is not None:
            maximum = limit if maximum is None else min(maximum, limit)
        if self.spec.kind == "entrypoint":
            yield from self._entrypoint_batches(maximum)
            return
        count = self.num_samples or 0
        order = self._order(count)
        produced = 0
        for start in range(0, count, self.spec.batch_size):
            if maximum is not None and produced >= maximum:
                return
            index = order[start:start + self.spec.batch_size]
            yield self._batch(index)
            produced += 1

    def _order(self, count: int) -> torch.Tensor:
        if not self.spec.shuffle:
            return torch.arange(count)
        generator = torch.Generator().manual_seed(self.spec.seed)
        return torch.randperm(count, generator=generator)

    def _batch(self, index: torch.Tensor) -> Batch:
        if self.spec.kind == "images":
            files = [self._files[i] for i in index.tolist()]
            images = [self._read_image(path) for path in files]
            self._first_size = getattr(self, "_first_size", None) or (files[0], tuple(images[0].shape))
            odd = {path: tuple(image.shape) for path, image in zip(files, images)
                   if tuple(image.shape) != self._first_size[1]}
            if odd:  # torch.stack would only say "stack expects each tensor to be equal size"
                raise SourceError(mixed_sizes_message(self._path(), self._first_size, odd))
            images = torch.stack(images)
            labels = None if self._labels is None else torch.tensor([self._labels[i] for i in index.tolist()])
            return images, labels
        assert self._inputs is not None
        labels = None if self._targets is None else self._targets[index]
        if isinstance(self._inputs, dict):
            return {name: tensor[index] for name, tensor in self._inputs.items()}, labels
        return self._inputs[index], labels

    # ----- kinds ------------------------------------------------------------------------------

    def _path(self) -> Path:
        path = Path(self.spec.path).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        return path

    def _index_images(self) -> None:
        root = self._path()
        if not root.is_dir():
            raise SourceError(f"{root}: no such folder of images.")
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise SourceError(f"{root}: no images found (looked for {', '.join(IMAGE_SUFFIXES)} in all sub-folders).")
        self._files = files
        # labels from the first-level sub-folder, when every image sits in one
        parents = [p.relative_to(root).parts for p in files]
        if all(len(parts) > 1 for parts in parents):
            self.classes = sorted({parts[0] for parts in parents})
            lookup = {name: i for i, name in enumerate(self.classes)}
            self._labels = [lookup[parts[0]] for parts in parents]

    def _read_image(self, path: Path) -> torch.Tensor:
        from PIL import Image, UnidentifiedImageError

        options = self.spec.image or ImageOptions()
        try:
            with Image.open(path) as opened:
                image = opened.convert("L" if options.grayscale else "RGB")
        except (UnidentifiedImageError, OSError) as error:
            raise SourceError(f"{path}: cannot be read as an image ({error}).") from error
        if options.resize is not None:
            width, height = image.size
            scale = options.resize / min(width, height)
            image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))),
                                 Image.Resampling.BILINEAR)
        if options.crop is not None:
            width, height = image.size
            if width < options.crop or height < options.crop:
                raise SourceError(f"{path}: image of {width}x{height} is smaller than the crop {options.crop}; "
                                  "set a resize at least as large as the crop.")
            left, top = (width - options.crop) // 2, (height - options.crop) // 2
            image = image.crop((left, top, left + options.crop, top + options.crop))
        array = np.asarray(image, dtype=np.float32) / 255.0
        tensor = torch.from_numpy(array.copy())
        tensor = tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)
        mean = torch.tensor(options.mean).view(-1, 1, 1)
        std = torch.tensor(options.std).view(-1, 1, 1)
        return (tensor - mean) / std

    def _load_tensors(self) -> None:
        path = self._path()
        if path.is_dir():
            inputs = torch.from_numpy(stack_npy_folder(path))
            self._inputs = inputs if inputs.is_floating_point() else inputs.float()
            return
        if not path.is_file():
            raise SourceError(f"{path}: no such tensor file.")
        suffix = path.suffix.lower()
        inputs: Any
        labels: Any = None
        try:
            if suffix == ".npy":
                inputs = np.load(path, allow_pickle=False)
            elif suffix == ".npz":
                with np.load(path, allow_pickle=False) as archive:
                    inputs, labels = _pick_arrays({k: archive[k] for k in archive.files}, path)
            elif suffix == ".safetensors":
                from safetensors.torch import load_file

                inputs, labels = _pick_arrays(load_file(str(path)), path)
            else:
                loaded = torch.load(path, map_location="cpu", weights_only=True)
                if isinstance(loaded, dict):
                    inputs, labels = _pick_arrays(loaded, path)
                elif isinstance(loaded, (tuple, list)) and len(loaded) == 2:
                    inputs, labels = loaded
                else:
                    inputs = loaded
        except SourceError:
            raise
        except Exception as error:
            reason, _ = unreadable_reason(path, error)
            raise SourceError(f"{path}: cannot be read as tensors: {reason}. Only plain arrays and tensors are "
                              "accepted (no pickled objects).") from error
        if isinstance(inputs, dict):
            inputs = {name: _input_tensor(value, path, f"input {name!r}") for name, value in inputs.items()}
            counts = {name: int(t.shape[0]) for name, t in inputs.items()}
            if len(set(counts.values())) > 1:
                raise SourceError(f"{path}: the inputs disagree on the number of samples: {counts}.")
        else:
            inputs = _input_tensor(inputs, path, "inputs")
        self._inputs = inputs
        samples = int(_first_tensor(inputs).shape[0])
        if labels is not None:
            labels = _as_tensor(labels, path, "labels")
            if labels.shape[0] != samples:
                raise SourceError(f"{path}: {samples} inputs but {labels.shape[0]} labels.")
            self._targets = labels.long() if not labels.is_floating_point() else labels

    def _entrypoint_batches(self, maximum: int | None) -> Iterator[Batch]:
        factory = load_entrypoint(self.spec.path, self.base_dir)
        try:
            iterable = factory(**self.spec.kwargs) if callable(factory) else factory
            iterator = iter(iterable)
        except Exception as error:
            raise SourceError(f"{self.spec.path} raised {type(error).__name__}: {error}") from error
        produced = 0
        while maximum is None or produced < maximum:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as error:
                raise SourceError(f"{self.spec.path} raised {type(error).__name__} while producing batch {produced}: "
                                  f"{error}") from error
            yield _normalise_batch(batch, self.spec.path, produced)
            produced += 1


def _pick_arrays(arrays: dict[str, Any], path: Path) -> tuple[Any, Any]:
    """(inputs, labels) of a file of named arrays: the array named like a single input (``inputs``,
    ``x``...), else the only other array, else every array but the labels as keyword inputs."""
    if not arrays:
        raise SourceError(f"{path}: holds no arrays.")
    inputs_key = next((k for k in INPUT_KEYS if k in arrays), None)
    labels_key = next((k for k in LABEL_KEYS if k in arrays), None)
    labels = None if labels_key is None else arrays[labels_key]
    if inputs_key is not None:
        return arrays[inputs_key], labels
    rest = {k: v for k, v in arrays.items() if k != labels_key}
    if not rest:
        raise SourceError(f"{path}: holds only labels ({labels_key!r}), no inputs.")
    if len(rest) == 1:
        return next(iter(rest.values())), labels
    bad = [k for k in rest if not k.isidentifier()]
    if bad:
        raise SourceError(f"{path}: arrays {bad} cannot be keyword arguments of the model's forward; name the "
                          f"arrays after its arguments (input_ids, attention_mask...) or name one of {INPUT_KEYS}.")
    return rest, labels


def _input_tensor(value: Any, path: Path | str, what: str) -> torch.Tensor:
    """An input array as a tensor with a sample dimension: floating data as float32, integers (token ids,
    masks) and booleans as they are."""
    tensor = _as_tensor(value, path, what)
    if tensor.dim() < 1 or tensor.shape[0] == 0:
        raise SourceError(f"{path}: the {what} must have a first (sample) dimension with at least one sample, "
                          f"got shape {tuple(tensor.shape)}.")
    if tensor.is_floating_point() and tensor.dtype != torch.float32:
        tensor = tensor.float()
    return tensor


def _first_tensor(inputs: Any) -> torch.Tensor:
    return next(iter(inputs.values())) if isinstance(inputs, dict) else inputs


def _as_tensor(value: Any, path: Path, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise SourceError(f"{path}: the {what} are an object array, not numbers.")
        return torch.from_numpy(np.ascontiguousarray(value))
    raise SourceError(f"{path}: the {what} are a {type(value).__name__}, not an array or tensor.")


def _normalise_batch(batch: Any, origin: str, index: int) -> Batch:
    """An entry point's batch as ``(inputs, labels)``: a tensor, a dict of keyword inputs (its ``labels``
    entry, if any, taken out as the labels), or an ``(inputs, labels)`` pair of those."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return torch.as_tensor(batch), None
    if isinstance(batch, Mapping):
        inputs = dict(batch)
        key = next((k for k in LABEL_KEYS if k in inputs), None)
        labels = inputs.pop(key) if key is not None else None
        return _keyword_inputs(inputs, origin, index), None if labels is None else torch.as_tensor(labels)
    if isinstance(batch, Sequence) and 1 <= len(batch) <= 2 and isinstance(batch[0], (torch.Tensor, np.ndarray,
                                                                                      Mapping)):
        first = batch[0]
        inputs = _keyword_inputs(dict(first), origin, index) if isinstance(first, Mapping) else torch.as_tensor(first)
        labels = torch.as_tensor(batch[1]) if len(batch) == 2 and batch[1] is not None else None
        return inputs, labels
    raise SourceError(f"{origin}: batch {index} is a {type(batch).__name__}; expected a tensor, a dict of inputs "
                      "by argument name, or an (inputs, labels) pair.")


def _keyword_inputs(inputs: dict, origin: str, index: int) -> dict[str, torch.Tensor]:
    converted = {}
    for name, value in inputs.items():
        if not isinstance(value, (torch.Tensor, np.ndarray)):
            raise SourceError(f"{origin}: batch {index}: input {name!r} is a {type(value).__name__}, not a tensor.")
        converted[str(name)] = torch.as_tensor(value)
    if not converted:
        raise SourceError(f"{origin}: batch {index} is an empty dict of inputs.")
    return converted


def open_data(spec: DataSpec, *, trust_code: bool = False, base_dir: Path | None = None) -> DataSource:
    """Open a data source (indexes a folder, loads a tensor file; entry points run when iterated).

    Raises:
        TrustRequired: an entry point without ``trust_code``.
        SourceError: a missing file or folder, unreadable content, inputs and labels that disagree.
    """
    return DataSource(spec, base_dir, trust_code)


def check_input(expected: InputSpec | None, data: InputSpec, origin: str) -> None:
    """Compare the model's declared input with what the data gives; the error names both shapes."""
    if expected is None:
        return
    if expected.named or data.named:
        if not expected.named:  # a shape typed for keyword inputs (--input-shape 128): each of them has it
            fits = all(tuple(shape) == tuple(expected.shape) for _, shape, _ in data.named)
        else:
            fits = [n for n, _, _ in expected.named] == [n for n, _, _ in data.named] and all(
                tuple(a[1]) == tuple(b[1]) for a, b in zip(expected.named, data.named))
        if not fits:
            raise SourceError(f"{origin} gives inputs {data.describe()}, but the model input is "
                              f"{expected.describe()}.")
        return
    if tuple(expected.shape) != tuple(data.shape):
        raise SourceError(f"{origin} gives inputs of shape {tuple(data.shape)} per sample, but the model input is "
                          f"{tuple(expected.shape)}.")
