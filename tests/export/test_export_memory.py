"""Peak memory of an export's file handling: folding streamed weights into one file copies their bytes in
chunks (the same file protobuf would write), and freed heap memory goes back between steps."""
from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from workbench.export.memory import release_freed_memory
from workbench.export.onnx_file import fold_external_data


def _graph_with_external_weights(folder):
    """A graph whose two big initializers (one with a doc string, at a non-zero offset) live in m.data."""
    rng = np.random.default_rng(0)
    arrays = {"w0": rng.standard_normal((300, 500)).astype(np.float32),
              "w1": rng.integers(-8, 8, (5000,)).astype(np.int8), "small": np.ones(3, np.float32)}
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    inits[0].doc_string = "the first layer's weight"
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])], inits)
    model = helper.make_model(graph)
    onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.data", size_threshold=64)
    return arrays


def test_folding_streamed_weights_writes_the_model_protobuf_would(tmp_path):
    arrays = _graph_with_external_weights(tmp_path)
    fold_external_data(tmp_path / "m.onnx", tmp_path / "m.data", tmp_path / "one.onnx")
    folded = onnx.load(str(tmp_path / "one.onnx"))
    onnx.checker.check_model(folded, full_check=True)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in folded.graph.initializer)
    found = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    assert found.keys() == arrays.keys()
    assert all(np.array_equal(found[name], arrays[name]) and found[name].dtype == arrays[name].dtype
               for name in arrays)
    assert {t.name: t.doc_string for t in folded.graph.initializer}["w0"] == "the first layer's weight"
    # the same model as loading the graph with its external data (as onnx does it, all in memory)
    whole = onnx.load(str(tmp_path / "m.onnx"))
    order = {t.name: i for i, t in enumerate(folded.graph.initializer)}
    whole.graph.initializer.sort(key=lambda t: order[t.name])  # the small ones first in the folded file
    assert folded == whole


def test_folding_a_truncated_weights_file_says_so(tmp_path):
    _graph_with_external_weights(tmp_path)
    data = tmp_path / "m.data"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(ValueError, match="m.data ends 100 bytes before the tensor"):
        fold_external_data(tmp_path / "m.onnx", data, tmp_path / "one.onnx")


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="malloc_trim is glibc's")
def test_freed_heap_memory_goes_back_to_the_system():
    """Blocks under glibc's (raised) mmap threshold come from the heap; freed, they stay in the process until
    released, as an export's weight-sized buffers did between steps."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 8 MB blocks from the heap, as under a threshold glibc raised by itself; fixed here because the product fixes
    # it at 1 MiB once a checkpoint opens lazily (sources/lazy_checkpoint.py), which a whole-suite run has done
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    assert libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) == 1
    blocks = [libc.malloc(8 * 2**20) for _ in range(9)]
    for block in blocks:
        ctypes.memset(block, 1, 8 * 2**20)  # touched: resident
    for block in blocks[:-1]:  # the last one stays, so the heap's top cannot shrink by itself
        libc.free(block)
    held = _rss_bytes()
    assert release_freed_memory() is True
    assert held - _rss_bytes() >= 48 * 2**20
    libc.free(blocks[-1])
    libc.mallopt(_M_MMAP_THRESHOLD, 1 * 2**20)  # the product's own setting: big blocks mmapped again
