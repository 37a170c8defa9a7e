"""A Hugging Face safetensors checkpoint opened without reading its weights: the module tree is built with its
parameters on the meta device, and each weight is read from the checkpoint when a job needs it.

``hf:DIR`` folders (one ``model.safetensors``, or shards listed by ``model.safetensors.index.json``) open here.
The tree is built by accelerate's ``init_empty_weights(include_buffers=False)``: parameters on meta, buffers real.
That keeps the buffers ``__init__`` computes and no checkpoint holds (rotary ``inv_freq``) exact, with no
per-architecture re-initialisation; torch's bare ``torch.device("meta")`` would put those on meta too. Persistent
buffers are small and are read from the checkpoint at once; parameters stay on meta.

:class:`LazyCheckpoint` is the :class:`~workbench.quant.algorithms.residency.BlockResidency` of such a model:
``load`` reads a submodule's parameters from the shards (plain file reads of the tensors asked for; safetensors
checks each shard's header when the folder opens) and swaps them *into the same Parameter objects*
(``torch.utils.swap_tensors``), so the float model, the quantized model (a structural copy sharing them) and tied
weights all see them; ``release`` swaps them back to meta, leaving quantizers' amax alone.
:meth:`LazyCheckpoint.streamed` pages weights in as operations use them and out past a budget of about one block
(the sample forwards of ``new``, ``open`` and ``show`` when they cannot run on shapes only, see
:mod:`workbench.sources.shapes_only`); :meth:`LazyCheckpoint.materialise` loads everything (what
a job that needs the whole model does first). The processes of one job on one machine (``--workers N``, torchrun
ranks) materialise with ``mapped=True``: the weights are views of the shard files mapped copy-on-write, so the ranks
share one copy in the page cache instead of each holding the whole model in its own memory (issue 37 point 5).
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import mmap
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from workbench.sources.errors import SourceError

__all__ = ["INDEX_NAME", "SINGLE_NAME", "LazyCheckpoint", "build_on_meta", "move_keeping_meta"]

logger = logging.getLogger(__name__)

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
T = TypeVar("T")


def _shards(folder: Path) -> tuple[Path | None, dict[str, Path]]:
    """The index file (None for a single file) and tensor name -> the shard that holds it, as the folder says."""
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (OSError, ValueError, AttributeError) as error:
            raise SourceError(f"{index}: not a readable safetensors index ({error}).") from error
        if not isinstance(weight_map, dict) or not weight_map:
            raise SourceError(f"{index}: has no weight_map (tensor name -> shard file).")
        return index, {str(key): folder / str(name) for key, name in weight_map.items()}
    single = folder / SINGLE_NAME
    files = [single] if single.is_file() else sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise SourceError(f"{folder}: {len(files)} safetensors files and no {INDEX_NAME} saying which tensor is in "
                          "which; save with model.save_pretrained(folder), which writes the index.")
    return None, {"": files[0]}  # keys come from the file's header


# safetensors' dtype names (its format's documentation) -> torch
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
_MMAP_THRESHOLD = 1 << 20


@functools.cache
def _return_freed_weights_to_the_system() -> bool:
    """Fix glibc's mmap threshold at 1 MiB (once per process); True where it applies.

    glibc raises the threshold to the size of each large block freed (up to 32 MiB), after which weights of a few
    MiB come from the heap, whose freed memory stays with the process: opening a 0.5B bf16 checkpoint block by block
    then peaked at 1.24 GiB with every weight back on meta, 0.67 GiB with the threshold fixed.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD))
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator decides
        return False


def _header(path: Path) -> tuple[int, dict[str, Any]]:
    """Where a safetensors file's data starts and its header (name -> dtype, shape, data_offsets): the format is an
    8-byte little-endian length, then that many bytes of JSON."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


class LazyCheckpoint:
    """The tensors of a safetensors checkpoint folder, read one at a time, and the residency of the model built
    on meta from it (see the module's docstring).

    Raises (at construction):
        SourceError: the index is unreadable, a shard it names is missing or not a safetensors file, or the index
            places a tensor in a shard that does not hold it (each names the file and the tensor).
    """

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        self.folder = folder
        self.index, where = _shards(folder)
        self._headers: dict[Path, tuple[int, dict[str, Any]]] = {}  # shard -> (where its data starts, its header)
        for path in sorted(set(where.values())):
            if not path.is_file():
                named = next(key for key, file in where.items() if file == path)
                raise SourceError(f"{path}: shard missing (the index {self.index} places {named} in it).")
            try:  # safetensors checks the header against the file (offsets inside it, no overlaps)
                with safe_open(str(path), framework="pt", device="cpu"):
                    pass
                self._headers[path] = _header(path)
            except Exception as error:
                raise SourceError(f"{path}: not a readable safetensors file ({type(error).__name__}: {error}).") \
                    from error
        if self.index is None:
            (path,) = self._headers
            where = {key: path for key in self._headers[path][1]}
        for key, path in where.items():
            if key not in self._headers[path][1]:
                raise SourceError(f"{path}: holds no tensor {key}, which the index {self.index} places there.")
        self._where = where
        self._owners: dict[int, str] = {}  # id(parameter) -> its checkpoint key
        self.device = torch.device("cpu")
        self._mapped = False  # read() gives views of the mapped shards (materialise(mapped=True))
        self._maps: dict[Path, mmap.mmap] = {}
        self._paging: _Paging | None = None  # the paging of the streamed run in progress
        _return_freed_weights_to_the_system()

    # ----- reading tensors ---------------------------------------------------------------------------------------

    def keys(self) -> list[str]:
        """Every tensor name the checkpoint holds."""
        return list(self._where)

    @property
    def nbytes(self) -> int:
        """The size of the shard files (what an eager load reads)."""
        return sum(path.stat().st_size for path in self._headers)

    def float_dtype(self) -> torch.dtype:
        """The dtype of the checkpoint's first floating-point tensor (float32 when it has none)."""
        for key, path in self._where.items():
            dtype = _DTYPES.get(self._headers[path][1][key]["dtype"])
            if dtype is not None and dtype.is_floating_point:
                return dtype
        return torch.float32

    def read(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``key`` from its shard, in ``dtype`` (the model's) on :attr:`device`.

        Read with plain file reads, not through a memory map: mapped pages once touched count in the process's
        resident memory until it exits (a 0.5B open that read each weight once through safetensors' map showed
        the whole checkpoint as resident), while read pages stay in the page cache only."""
        path = self._where.get(key)
        if path is None:
            raise SourceError(f"{self.index or self.folder}: has no tensor {key}.")
        start, header = self._headers[path]
        entry = header[key]
        if self._mapped and self.device.type == "cpu" and _DTYPES[entry["dtype"]] == (dtype or _DTYPES[entry["dtype"]]):
            mapped = self._mapped_view(path, start, entry)
            if mapped is not None:
                return mapped
        try:
            begin, end = (int(offset) for offset in entry["data_offsets"])
            tensor = torch.empty(end - begin, dtype=torch.uint8)
            with open(path, "rb") as handle:
                handle.seek(start + begin)
                if handle.readinto(memoryview(tensor.numpy())) != end - begin:
                    raise ValueError("the file ends before the tensor")
            tensor = tensor.view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        except Exception as error:  # a shard truncated or changed after the folder was opened
            raise SourceError(f"{path}: tensor {key} cannot be read ({type(error).__name__}: {error}).") from error
        return tensor.to(device=self.device, dtype=dtype or tensor.dtype)

    def read_strided(self, key: str, dtype: torch.dtype, step: int, count: int) -> torch.Tensor:
        """``read(key, dtype).reshape(-1)[::step][:count]``, reading only those values: a few pages of the shard
        through a memory map that is closed before it returns (no resident memory stays), where :meth:`read`
        reads the whole tensor (a weights digest of a 7B checkpoint sampled 4096 values of each tensor by reading
        13.5 GB)."""
        import numpy as np

        path = self._where.get(key)
        if path is None:
            raise SourceError(f"{self.index or self.folder}: has no tensor {key}.")
        start, header = self._headers[path]
        entry = header[key]
        stored = _DTYPES[entry["dtype"]]
        size = torch.empty((), dtype=stored).element_size()
        try:
            begin, end = (int(offset) for offset in entry["data_offsets"])
            if end <= begin:
                return torch.empty(0, dtype=dtype)
            mapped = np.memmap(path, dtype=np.uint8, mode="r", offset=start + begin, shape=(end - begin,))
            picked = np.array(mapped.reshape(-1, size)[::step][:count])  # a copy: the map closes with its last view
            del mapped
        except Exception as error:  # a shard truncated or changed after the folder was opened
            raise SourceError(f"{path}: tensor {key} cannot be read ({type(error).__name__}: {error}).") from error
        return torch.from_numpy(picked).reshape(-1).view(stored).to(dtype)

    def _mapped_view(self, path: Path, start: int, entry: dict[str, Any]) -> torch.Tensor | None:
        """The tensor as a view of its shard mapped copy-on-write (writes stay private to this process; reads share
        the page cache with every process mapping the file); None where it cannot be (misaligned for its dtype)."""
        dtype = _DTYPES[entry["dtype"]]
        begin, end = (int(offset) for offset in entry["data_offsets"])
        if (start + begin) % dtype.itemsize:
            return None
        mapping = self._maps.get(path)
        if mapping is None:
            try:
                with open(path, "rb") as handle:
                    mapping = self._maps[path] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as error:
                raise SourceError(f"{path}: cannot be mapped ({type(error).__name__}: {error}).") from error
        if start + end > len(mapping):
            raise SourceError(f"{path}: tensor {entry} ends past the file (changed after it was opened?).")
        if end == begin:
            return torch.empty(entry["shape"], dtype=dtype)
        count = (end - begin) // dtype.itemsize
        return torch.frombuffer(mapping, dtype=dtype, count=count, offset=start + begin).reshape(entry["shape"])

    def read_state(self, model: nn.Module) -> Callable[[str, torch.Tensor], torch.Tensor]:
        """A reader for :func:`workbench.session.weights.weights_digest`: a state_dict entry's real value (read
        from the checkpoint when it is on meta)."""
        keys = {name: self._owners.get(id(p), name) for name, p in model.named_parameters(remove_duplicate=False)}

        def value(name: str, tensor: torch.Tensor) -> torch.Tensor:
            return self.read(keys.get(name, name), tensor.dtype) if tensor.is_meta else tensor
        return value

    def sampled_state(self, model: nn.Module) -> Callable[[str, torch.Tensor, int, int], torch.Tensor]:
        """A sampler for :func:`workbench.session.weights.weights_digest`: ``(name, tensor, step, count)`` -> the
        values ``tensor.reshape(-1)[::step][:count]`` of a state_dict entry, read from the checkpoint (only those)
        when it is on meta."""
        keys = {name: self._owners.get(id(p), name) for name, p in model.named_parameters(remove_duplicate=False)}

        def sample(name: str, tensor: torch.Tensor, step: int, count: int) -> torch.Tensor:
            if tensor.is_meta:
                return self.read_strided(keys.get(name, name), tensor.dtype, step, count)
            return tensor.detach().reshape(-1)[::step][:count]
        return sample

    # ----- the model built from it -------------------------------------------------------------------------------

    def attach(self, model: nn.Module) -> None:
        """Map ``model``'s parameters to the checkpoint's tensors and read its persistent buffers now.

        Tied parameters (one tensor under two names) map to whichever name the checkpoint holds.

        Raises:
            SourceError: a parameter or buffer of the model is not in the checkpoint (names the tensor and the
                index or file that should hold it).
        """
        aliases: dict[int, list[str]] = {}
        for name, parameter in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(parameter), []).append(name)
        missing = []
        for names in aliases.values():
            key = next((name for name in names if name in self._where), None)
            if key is None:
                missing.append(names[0])
            else:
                self._owners[id(model.get_parameter(names[0]))] = key
        state = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name not in state:
                    continue  # non-persistent: __init__ computed it, no checkpoint holds it
                if name not in self._where:
                    missing.append(name)
                    continue
                buffer.copy_(self.read(name, buffer.dtype).to(buffer.device))
        if missing:
            raise SourceError(f"{self.index or next(iter(self._headers))}: has no tensor {missing[0]}"
                              + (f" (nor {len(missing) - 1} more: {', '.join(missing[1:4])}...)" if len(missing) > 1
                                 else "") + f", a weight of {type(model).__name__}.")

    def key_of(self, parameter: torch.Tensor) -> str | None:
        """The checkpoint's name of an attached model's parameter (None: not one of them)."""
        return self._owners.get(id(parameter))

    def covers(self, model: nn.Module) -> bool:
        """Whether the checkpoint names any of ``model``'s parameters as they are named (False when the weights
        need transformers' renaming, e.g. a checkpoint saved from the base model under another prefix)."""
        return any(name in self._where for name, _ in model.named_parameters(remove_duplicate=False))

    def _held(self, module: nn.Module, recurse: bool = True) -> Iterator[nn.Parameter]:
        seen: set[int] = set()
        for parameter in module.parameters(recurse=recurse):
            if id(parameter) in self._owners and id(parameter) not in seen:
                seen.add(id(parameter))
                yield parameter

    def load(self, name: str, module: nn.Module) -> None:
        """Read the weights of ``module`` (and its children) into its parameters, in their dtype."""
        self._load(list(self._held(module)))

    def release(self, name: str, module: nn.Module) -> None:
        """Send the weights of ``module`` (and its children) back to meta; quantizers' amax (buffers) stay."""
        self._release(list(self._held(module)))

    def _load(self, parameters: list[nn.Parameter]) -> None:
        # swapped into the same Parameter objects: every module sharing them (copies, tied weights) sees them
        with torch.no_grad(), torch._C.DisableTorchFunction():
            for parameter in parameters:
                if parameter.is_meta:
                    value = self.read(self._owners[id(parameter)], parameter.dtype)
                    torch.utils.swap_tensors(parameter, nn.Parameter(value, requires_grad=parameter.requires_grad))

    def _release(self, parameters: list[nn.Parameter]) -> None:
        with torch._C.DisableTorchFunction():
            for parameter in parameters:
                if parameter.is_meta:
                    continue
                empty = nn.Parameter(torch.empty(parameter.shape, dtype=parameter.dtype, device="meta"),
                                     requires_grad=parameter.requires_grad)
                try:
                    torch.utils.swap_tensors(parameter, empty)
                except RuntimeError:  # weakly referenced (a calibrator remembering its last weight): stays loaded
                    logger.debug("%s stays in memory: %s", self._owners.get(id(parameter)), "weakly referenced")

    def resident(self, module: nn.Module) -> bool:
        """True when every weight of ``module`` is in memory."""
        return not any(p.is_meta for p in self._held(module))

    def materialise(self, model: nn.Module, mapped: bool = False) -> None:
        """Load every weight of ``model`` (a job that needs the whole model, as an eager load would have). Within
        :meth:`streamed` it does nothing: the paging reads each weight as the job uses it.

        ``mapped``: weights in the checkpoint's dtype become views of the shard files mapped copy-on-write (on the
        CPU), so that the processes of one job share one copy of them in the page cache; each process's RSS still
        counts the pages it touched, its USS does not."""
        if self._paging is not None:
            return
        if not self.resident(model):
            logger.info("%s every weight of %s from %s", "mapping" if mapped else "reading", type(model).__name__,
                        self.folder)
            self._mapped = mapped
            try:
                self.load("", model)
            finally:
                self._mapped = False

    def budget(self, model: nn.Module) -> int:
        """Bytes of weights a streamed run keeps in memory at most: the largest block (an item of a ModuleList, a
        decoder layer) or twice the largest single weight, whichever is more."""
        def size(parameters: Iterator[nn.Parameter]) -> int:
            return sum(p.numel() * p.element_size() for p in parameters)
        blocks = [size(self._held(child)) for module in model.modules() if isinstance(module, nn.ModuleList)
                  for child in module]
        largest = max((size(iter([p])) for p in self._held(model)), default=0)
        return max(blocks + [2 * largest])

    @contextmanager
    def streamed(self, model: nn.Module) -> Iterator[_Paging]:
        """Within it, a weight of ``model`` still on meta is read when an operation uses it, and the weights read
        longest ago go back to meta once more than :meth:`budget` bytes are in memory: a forward of the whole model
        (or of any copy sharing its parameters, or an fx interpreter reading them) holds about one block. Yields
        the paging (its ``paused()`` lets a step see the weights on meta)."""
        with _Paging(self, self.budget(model)) as paging:
            outer, self._paging = self._paging, paging
            try:
                yield paging
            finally:
                self._paging = outer
                paging.release_all()

    def run_streamed(self, model: nn.Module, job: Callable[[], T]) -> T:
        """``job()`` (a forward, or a build that runs some) with the weights paged in as it uses them (see
        :meth:`streamed`); when it still fails, every weight is loaded and it runs again, as eagerly."""
        if self.resident(model):
            return job()
        try:
            with self.streamed(model):
                return job()
        except Exception as error:
            logger.info("a streamed run of %s failed (%s: %s); loading every weight", type(model).__name__,
                        type(error).__name__, error)
        self.materialise(model)
        return job()


# what a tensor says about itself without its data: reading these does not load a weight
_METADATA = {torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.ndim.__get__,
             torch.Tensor.is_meta.__get__, torch.Tensor.requires_grad.__get__, torch.Tensor.size, torch.Tensor.dim,
             torch.Tensor.numel, torch.Tensor.element_size, torch.Tensor.is_floating_point}


class _Paging(TorchFunctionMode):
    """Reads a lazily held weight when an operation gets it (its data, or its device), and sends the weights read
    longest ago back to meta past ``budget`` bytes (never one the current operation uses)."""

    def __init__(self, checkpoint: LazyCheckpoint, budget: int) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.budget = budget
        self.loaded: OrderedDict[int, nn.Parameter] = OrderedDict()
        self.bytes = 0
        self.peak = 0  # the most bytes of weights paged in at once
        self.is_paused = False

    def __enter__(self) -> _Paging:
        # a weight handed to a module (a weight quantizer's forward) is read before the module runs: an autograd
        # Function's apply holds its inputs, and a tensor held there cannot be swapped when an operation inside
        # asks for it
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._module_inputs)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        self._hook.remove()
        return super().__exit__(*exc)

    def _module_inputs(self, module: nn.Module, args: Any) -> None:
        if self.is_paused:
            return
        owners = self.checkpoint._owners
        used = [t for t in args if isinstance(t, nn.Parameter) and id(t) in owners]
        for parameter in used:
            self.page_in(parameter, {id(p) for p in used})

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Within it no weight is paged in (and none is in memory on entry): operations see them on meta."""
        self.release_all()
        self.is_paused, was = True, self.is_paused
        try:
            yield
        finally:
            self.is_paused = was

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func not in _METADATA and not self.is_paused:
            owners = self.checkpoint._owners
            used = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, nn.Parameter) and id(t) in owners]
            for parameter in used:
                self.page_in(parameter, {id(p) for p in used})
        return func(*args, **kwargs)

    def page_in(self, parameter: nn.Parameter, keep: set[int]) -> None:
        if id(parameter) in self.loaded:
            self.loaded.move_to_end(id(parameter))
            return
        if not parameter.is_meta:
            return  # loaded outside this run (a job materialised it): not ours to release
        size = parameter.numel() * parameter.element_size()
        for key in [key for key in self.loaded if key not in keep]:
            if self.bytes + size <= self.budget:
                break
            old = self.loaded.pop(key)
            self.bytes -= old.numel() * old.element_size()
            self.checkpoint._release([old])
        self.checkpoint._load([parameter])
        self.loaded[id(parameter)] = parameter
        self.bytes += size
        self.peak = max(self.peak, self.bytes)

    def release_all(self) -> None:
        self.checkpoint._release(list(self.loaded.values()))
        self.loaded.clear()
        self.bytes = 0


def build_on_meta(model_class: Any, config: Any, dtype: torch.dtype | None, **kwargs: Any) -> nn.Module:
    """``model_class`` (a transformers model) from ``config`` with its parameters on meta, buffers real."""
    from accelerate import init_empty_weights

    # the Auto classes build from a config with from_config, a model class with _from_config (what both call)
    build = model_class.from_config if hasattr(model_class, "from_config") else model_class._from_config
    with init_empty_weights(include_buffers=False):
        model = build(config, dtype=dtype, **kwargs)
    if hasattr(model, "tie_weights"):  # from_pretrained ties them (lm_head to the embeddings) after loading
        model.tie_weights()
    return model


def move_keeping_meta(model: nn.Module, device: torch.device) -> nn.Module:
    """``model.to(device)`` for a model whose weights may be on meta: those stay there (a lazily opened model
    reads them onto the device when they are loaded)."""
    return model._apply(lambda tensor: tensor if tensor.is_meta else tensor.to(device))
