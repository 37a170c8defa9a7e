"""The dtype check of traced modules (workbench.graph.verify.value_dtypes) runs on meta tensors, not on the sample's
values: opening a project no longer computes a forward of each traced module's whole subtree. Where meta cannot
stand for the values (a forward that reads one, a module that keeps what it computed) the real run decides, and
the placement is what the real run gives."""
import torch
import torch.fx as fx
from torch import nn

from workbench.graph import insert_functional_quantizers
from workbench.graph.verify import capture_calls, value_dtypes
from workbench.quant.nn import QuantAdd


class Counted(nn.Linear):
    """A Linear that counts the calls it computed on real values."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.real_calls = 0

    def forward(self, x):
        self.real_calls += not x.is_meta
        return super().forward(x)


class Cast(nn.Module):
    """Gives back its input in ``dtype``: the same class, a different dtype per instance."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype)


class Block(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.lin = Counted(8, 8)
        self.cast = Cast(dtype)

    def forward(self, x):
        return self.cast(self.lin(x)) + self.cast(x)


class Net(nn.Module):
    def __init__(self, *blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class _OwnForward(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        return True


def _traced(block: nn.Module, *inputs):
    """``block``'s own forward traced (its children calls), and the call the sample run gave it."""
    calls = capture_calls(block, inputs)
    return fx.GraphModule(block, _OwnForward().trace(block)), calls[id(block)]


def test_the_dtype_check_computes_no_forward_of_the_subtree():
    block = Block()
    gm, call = _traced(block, torch.randn(2, 8))
    before = block.lin.real_calls
    dtypes = value_dtypes(gm, call)
    assert block.lin.real_calls == before  # before: the check ran the Linear on the sample once more
    assert {n.name: d for n, d in dtypes.items()} == {"x": torch.float32, "lin": torch.float32,
                                                      "cast": torch.float32, "cast_1": torch.float32,
                                                      "add": torch.float32, "output": torch.float32}


def test_blocks_of_one_class_with_different_dtypes_keep_their_own_placement():
    torch.manual_seed(0)
    model = Net(Block(torch.float32), Block(torch.float32), Block(torch.int64)).eval()
    result, report = insert_functional_quantizers(model, example_inputs=torch.randn(2, 8))
    # an add of integers gets no quantizer; the float blocks' adds do
    assert report.inserted_names == ["blocks.0.add", "blocks.1.add"]
    assert isinstance(result.blocks[1].add, QuantAdd) and not hasattr(result.blocks[2], "add")


class ReadsValues(nn.Module):
    """Picks the dtype from a value (meta has none): the real run decides."""

    def forward(self, x):
        return x.long() if bool((x > 100).all()) else x


class ValueBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.pick = ReadsValues()

    def forward(self, x):
        return self.pick(self.lin(x)) + self.pick(x)


def test_a_forward_that_reads_values_is_checked_on_them():
    torch.manual_seed(0)
    model = Net(ValueBlock()).eval()
    big = torch.full((2, 8), 1000.0)
    _, report = insert_functional_quantizers(model, example_inputs=big)
    assert report.inserted_names == []  # x > 100 everywhere: integers, no quantizer
    _, report = insert_functional_quantizers(Net(ValueBlock()).eval(), example_inputs=torch.randn(2, 8))
    assert report.inserted_names == ["blocks.0.add"]


class Keeps(nn.Module):
    """Keeps the last tensor it computed (a cos/sin cache)."""

    def forward(self, x):
        self.kept = x * 2
        return self.kept


class KeepBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.keep = Keeps()

    def forward(self, x):
        return self.keep(x) + x


def test_a_module_that_keeps_what_it_computed_keeps_real_values():
    model = Net(KeepBlock()).eval()
    x = torch.randn(2, 8)
    result, report = insert_functional_quantizers(model, example_inputs=x)
    assert report.inserted_names == ["blocks.0.add"]
    kept = result.blocks[0].keep.kept
    assert not kept.is_meta and torch.equal(kept, x * 2)


class Cache:
    """An object holding tensors that a forward extends (a transformers cache)."""

    def __init__(self):
        self.items = [torch.zeros(2, 8)]

    def extend(self, x):
        self.items.append(x)
        return torch.cat(self.items).sum(0, keepdim=True)


class CacheBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, cache):
        return self.lin(x) + cache.extend(x)


def test_the_check_leaves_a_cache_argument_as_the_sample_run_left_it():
    block = CacheBlock().eval()
    cache = Cache()
    gm, call = _traced(block, torch.randn(2, 8), cache)
    length = len(cache.items)
    dtypes = value_dtypes(gm, call)
    assert len(cache.items) == length  # before: the check's run appended to the caller's cache
    assert all(not t.is_meta for t in cache.items)
    assert dtypes and all(d == torch.float32 for n, d in dtypes.items() if n.name != "cache")


class TiedBlock(nn.Module):
    """Two layers holding one weight (tied embeddings)."""

    def __init__(self):
        super().__init__()
        self.a = Counted(8, 8)
        self.b = Counted(8, 8)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.a(x) + self.b(x)


def test_a_weight_held_under_two_names_is_checked_on_meta_too():
    block = TiedBlock()
    gm, call = _traced(block, torch.randn(2, 8))
    before = block.a.real_calls, block.b.real_calls
    dtypes = value_dtypes(gm, call)
    assert (block.a.real_calls, block.b.real_calls) == before
    assert dtypes and all(d == torch.float32 for d in dtypes.values())
    assert block.b.weight is block.a.weight and not block.a.weight.is_meta
