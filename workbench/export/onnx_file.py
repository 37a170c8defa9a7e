"""Writing an exported graph: first to a temporary file next to the target, moved into place only once
validated; a graph over protobuf's 2 GB limit goes with its weights in ONNX external data
(``model.onnx.data`` beside ``model.onnx``), validated from the file the same way.

Peak memory: a graph whose weights exceed :data:`STREAM_THRESHOLD` is exported with its weights in a
temporary data file too, even when it ends up as one file, so that no step holds a serialised copy of
them (a ModelProto holding the weights, its bytes, the checker's copy). It is validated in that form and
folded into one file on commit, each tensor's bytes copied in chunks, with the framing protobuf itself would
write: one ``graph`` field whose length counts the weights that follow. (Concatenated fragments, each its own
``graph`` field, parse the same in protobuf, onnxruntime and TensorRT, which merge them, but netron's reader
keeps only the last ``graph`` and drew an empty canvas for any model over the threshold.)
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "SMALL_TENSOR",
    "STREAM_THRESHOLD",
    "compact_external_data",
    "fold_external_data",
    "StagedFile",
    "stage",
    "write_onnx",
    "external_data_file",
    "relocate_external_data",
    "temporary_name",
]

# protobuf refuses to serialise a message of 2 GiB or more
EXTERNAL_DATA_THRESHOLD = 2 * 1024 ** 3 - 1
# initializers smaller than this stay inside the graph file (scales, zero points, shapes)
SMALL_TENSOR = 1024
# weights above this go through a temporary data file during export, whatever the final form (see above)
STREAM_THRESHOLD = 8 * 1024 ** 2


@dataclass
class StagedFile:
    """A graph written next to ``target`` under a temporary name (with its external data, if any)."""

    target: Path
    path: Path                       # the temporary graph file: validate this one
    data_path: Path | None = None    # its external data file (temporary name)
    fold: bool = False               # the data is under the threshold: commit writes one file

    @property
    def external_data_path(self) -> Path | None:
        """Where the external data ends up after :meth:`commit` (None: the graph holds its weights)."""
        if self.data_path is None or self.fold:
            return None
        return self.target.with_name(self.target.name + ".data")

    @property
    def size(self) -> int:
        """Bytes on disk, graph and external data together."""
        return self.path.stat().st_size + (self.data_path.stat().st_size if self.data_path is not None else 0)

    def commit(self) -> None:
        """Move the files into place; the graph's external-data references follow the data file's new name.
        A folded graph becomes one file with its weights inside."""
        if self.data_path is not None and self.fold:
            folded = temporary_name(self.target, ".fold")
            try:
                fold_external_data(self.path, self.data_path, folded)
                os.replace(folded, self.path)
            except BaseException:
                folded.unlink(missing_ok=True)
                raise
            self.data_path.unlink()
            self.data_path = None
        if self.data_path is not None:
            final_data = self.external_data_path
            model = onnx.load(str(self.path), load_external_data=False)
            relocate_external_data(model, final_data.name)
            onnx.save_model(model, str(self.path))
            os.replace(self.data_path, final_data)
            self.data_path = None
        os.replace(self.path, self.target)

    def discard(self) -> None:
        for path in (self.path, self.data_path):
            if path is not None and path.exists():
                path.unlink()


def temporary_name(target: Path, suffix: str = ".tmp") -> Path:
    """A new, empty file beside ``target`` with a hidden temporary name, mode as the umask allows."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # mkstemp's 0600 would make the file unshareable: the umask's mode
    return Path(name)


def stage(proto: onnx.ModelProto, target: Path, threshold: int = EXTERNAL_DATA_THRESHOLD, *,
          keep_proto: bool = True) -> StagedFile:
    """Write ``proto`` to a temporary file beside ``target``; over ``threshold`` bytes, with external data.

    A ``proto`` whose weights are external already (a large export keeps them in a temporary data file
    beside ``target``, see :func:`external_data_file`) is written as it is and its data file adopted:
    nothing serialises the weights. Otherwise ``proto`` is left as it was (writing external data empties
    the tensors of the copy written), unless ``keep_proto`` is False: then it is written without a copy.
    """
    staged = StagedFile(target, temporary_name(target))
    name = str(staged.path)
    try:
        adopted = external_data_file(proto, target.parent)
        if adopted is not None:
            staged.data_path = adopted
            compact_external_data(proto, adopted)
            staged.fold = adopted.stat().st_size <= threshold
            onnx.save_model(proto, name)
        elif _weight_bytes(proto) > threshold:
            staged.data_path = staged.path.with_name(staged.path.name + ".data")
            if keep_proto:
                copy = onnx.ModelProto()
                copy.CopyFrom(proto)
            else:
                copy = proto
            onnx.save_model(copy, name, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=staged.data_path.name, size_threshold=SMALL_TENSOR)
        else:
            onnx.save_model(proto, name)
    except BaseException:
        staged.discard()
        raise
    return staged


def external_data_file(proto: onnx.ModelProto, folder: Path) -> Path | None:
    """The one file in ``folder`` holding ``proto``'s external tensors, or None when it holds its weights.

    Raises:
        ValueError: the tensors point to several files, or outside ``folder``.
    """
    locations = {entry.value for tensor in _external_tensors(proto) for entry in tensor.external_data
                 if entry.key == "location"}
    if not locations:
        return None
    if len(locations) > 1 or any("/" in name or "\\" in name for name in locations):
        raise ValueError(f"The graph's weights are in {sorted(locations)}; expected one file beside it.")
    return folder / locations.pop()


def relocate_external_data(proto: onnx.ModelProto, location: str) -> None:
    """Point every external tensor of ``proto`` at the data file ``location`` (a name beside the graph)."""
    for tensor in _external_tensors(proto):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location


def _weight_bytes(proto: onnx.ModelProto) -> int:
    """The bytes of the tensors held in the graph itself (ByteSize would serialise the whole model, which
    fails over 2 GB)."""
    tensors = _tensors(proto)
    return sum(len(t.raw_data) + 4 * (len(t.float_data) + len(t.int32_data)) + 8 * (len(t.int64_data)
               + len(t.double_data) + len(t.uint64_data)) + sum(len(v) for v in t.string_data) for t in tensors)


def compact_external_data(proto: onnx.ModelProto, data_path: Path) -> int:
    """Drop the bytes of ``data_path`` that no tensor of ``proto`` points to; returns how many were dropped.

    The exporter streams the weights into the data file before the graph is post-processed; tensors the passes
    then replace (an INT4 weight packed again, a folded cast) leave their first bytes behind, unreferenced. The
    referenced spans are copied, in chunks and in the tensors' order, to a new file that replaces the old one,
    and each tensor's offset in ``proto`` is updated.
    """
    tensors = _external_tensors(proto)
    spans = [_place(tensor, data_path) for tensor in tensors]
    size = data_path.stat().st_size
    if sum(length for _, length in spans) >= size:
        return 0
    compacted = temporary_name(data_path, ".compact")
    try:
        with open(data_path, "rb") as source, open(compacted, "wb") as target:
            for tensor, (offset, length) in zip(tensors, spans):
                _set_external(tensor, "offset", str(target.tell()))
                _set_external(tensor, "length", str(length))
                source.seek(offset)
                left = length
                while left:
                    chunk = source.read(min(left, _COPY_CHUNK))
                    if not chunk:
                        raise ValueError(f"{data_path.name} ends before the {length} bytes of {tensor.name!r}")
                    target.write(chunk)
                    left -= len(chunk)
        dropped = size - compacted.stat().st_size
        os.replace(compacted, data_path)
    except BaseException:
        compacted.unlink(missing_ok=True)
        raise
    return dropped


def _place(tensor: onnx.TensorProto, data_path: Path) -> tuple[int, int]:
    """(offset, length) of an external tensor's bytes in ``data_path`` (no length: to the end of the file)."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    offset = int(info.get("offset", 0))
    return offset, int(info["length"]) if "length" in info else data_path.stat().st_size - offset


def _set_external(tensor: onnx.TensorProto, key: str, value: str) -> None:
    for entry in tensor.external_data:
        if entry.key == key:
            entry.value = value
            return
    tensor.external_data.add(key=key, value=value)


def fold_external_data(graph_path: Path, data_path: Path, out_path: Path) -> None:
    """Write the graph at ``graph_path`` with its external tensors (in ``data_path``) inside, as one file at
    ``out_path``, copying each tensor's bytes in chunks (none is held whole).

    The file is what ``onnx.save_model`` writes for the model with those tensors appended to its initializers,
    byte for byte: the model's fields before ``graph``, one ``graph`` field (its length known beforehand from
    each tensor's size), the graph's fields up to its initializers, the small initializers, then each external
    tensor read and framed in turn, the graph's remaining fields and the model's remaining fields. Tensors that
    are not top-level initializers (in a subgraph or an attribute) are loaded the ordinary way.

    Raises:
        ValueError: a tensor's data is in another file than ``data_path``, or shorter than its metadata says.
    """
    model = onnx.load(str(graph_path), load_external_data=False)
    external_inits = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if len(external_inits) != len(_external_tensors(model)):
        onnx.external_data_helper.load_external_data_for_model(model, str(data_path.parent))
        onnx.save_model(model, str(out_path))
        return
    kept = [t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    places = []  # (offset, length) of each tensor's bytes in the data file
    for meta in external_inits:
        location = next((entry.value for entry in meta.external_data if entry.key == "location"), None)
        if location != data_path.name:
            raise ValueError(f"weight {meta.name!r} is in {location!r}, expected {data_path.name!r}")
        places.append(_place(meta, data_path))
    # each tensor as protobuf would write it: its fields numbered below raw_data, raw_data (copied from the
    # data file in chunks, never held whole: a small model's largest layer is half its weights), the rest
    parts = [_split_fields(_inline_meta(meta), _RAW_DATA) for meta in external_inits]
    lengths = [len(low) + _field_size(_RAW_DATA, length) + len(high) for (low, high), (_, length) in zip(parts, places)]
    graph_head, graph_tail = _split_fields(model.graph, _GRAPH_INITIALIZER)
    model.ClearField("graph")
    model_head, model_tail = _split_fields(model, _MODEL_GRAPH)
    graph_size = len(graph_head) + len(graph_tail) + sum(_message_size(n) for n in lengths)
    with open(out_path, "wb") as out, open(data_path, "rb") as data:
        out.write(model_head)
        out.write(_key(_MODEL_GRAPH) + _varint(graph_size))
        out.write(graph_head)
        for meta, (low, high), (offset, length), tensor_length in zip(external_inits, parts, places, lengths):
            out.write(_key(_GRAPH_INITIALIZER) + _varint(tensor_length) + low)
            out.write(_key(_RAW_DATA) + _varint(length))
            _copy(data, out, offset, length, meta.name, data_path)
            out.write(high)
        out.write(graph_tail)
        out.write(model_tail)


# field numbers of onnx.proto used by the fold (ModelProto.graph, GraphProto.initializer, TensorProto.raw_data)
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_RAW_DATA = 9


_COPY_CHUNK = 1024 ** 2


def _copy(data, out, offset: int, length: int, name: str, data_path: Path) -> None:
    """Copy ``length`` bytes at ``offset`` of ``data`` to ``out`` in chunks."""
    data.seek(offset)
    left = length
    while left:
        chunk = data.read(min(left, _COPY_CHUNK))
        if not chunk:
            raise ValueError(f"weight {name!r}: {data_path} ends {left} bytes before the tensor it should hold "
                             f"({length} bytes at {offset})")
        out.write(chunk)
        left -= len(chunk)


def _inline_meta(meta: onnx.TensorProto) -> onnx.TensorProto:
    """``meta`` (an external tensor) as an inline one without data yet."""
    tensor = onnx.TensorProto()
    tensor.CopyFrom(meta)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT  # as onnx.load marks a tensor it read from external data
    tensor.ClearField("raw_data")
    return tensor


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int) -> bytes:
    """The key of a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2)


def _field_size(number: int, length: int) -> int:
    """Bytes a length-delimited field of ``length`` bytes takes, key and length included."""
    return len(_key(number)) + len(_varint(length)) + length


def _message_size(length: int) -> int:
    """Bytes an initializer entry of ``length`` bytes takes in its graph."""
    return _field_size(_GRAPH_INITIALIZER, length)


def _split_fields(message: Any, number: int) -> tuple[bytes, bytes]:
    """``message`` serialised as two parts: its fields numbered up to ``number`` and those after; protobuf
    writes fields in number order, so what goes between the parts lands where its own serialiser puts it."""
    head, tail = type(message)(), type(message)()
    head.CopyFrom(message)
    tail.CopyFrom(message)
    for field, _ in message.ListFields():
        (tail if field.number <= number else head).ClearField(field.name)
    return head.SerializeToString(), tail.SerializeToString()


def write_onnx(proto: onnx.ModelProto, target: Path, threshold: int = EXTERNAL_DATA_THRESHOLD, *,
               keep_proto: bool = True) -> Path:
    """Write ``proto`` at ``target`` all at once (external data beside it when large)."""
    staged = stage(proto, target, threshold, keep_proto=keep_proto)
    try:
        staged.commit()
    except BaseException:
        staged.discard()
        raise
    return target


def _tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of the graph: initializers and node attributes, subgraphs included."""
    found: list[onnx.TensorProto] = []

    def visit(graph: onnx.GraphProto) -> None:
        found.extend(graph.initializer)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    found.append(attribute.t)
                found.extend(attribute.tensors)
                if attribute.HasField("g"):
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)

    visit(model.graph)
    return found


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Tensors stored outside the graph file."""
    return [t for t in _tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]
