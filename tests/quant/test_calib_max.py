"""MaxCalibrator: running abs max per tensor and per axis, NaN/Inf accounting, saved state."""
import gc
import weakref

import numpy as np
import pytest
import torch

from workbench.quant.calib import MaxCalibrator, memory


def test_per_tensor_running_max():
    calibrator = MaxCalibrator(8, None, False)
    assert calibrator.compute_amax() is None
    calibrator.collect(torch.tensor([0.5, -2.0]))
    calibrator.collect(torch.tensor([1.5, -0.1]))
    assert calibrator.compute_amax().item() == 2.0
    assert calibrator.compute_amax().dim() == 0
    assert (calibrator.batches_seen, calibrator.values_seen) == (2, 4)


@pytest.mark.parametrize("axis, keep", [(0, (0,)), (1, (1,)), ((0, 1), (0, 1)), (-1, (3,))])
def test_per_axis(axis, keep):
    calibrator = MaxCalibrator(8, axis, False)
    a, b = torch.randn(4, 5, 3, 2), torch.randn(4, 5, 3, 2)
    calibrator.collect(a)
    calibrator.collect(b)
    dims = [d for d in range(4) if d not in keep]
    expected = torch.maximum(a.abs().amax(dim=dims, keepdim=True), b.abs().amax(dim=dims, keepdim=True))
    assert torch.equal(calibrator.compute_amax(), expected)


def test_an_axis_over_every_dimension_keeps_one_amax_per_element():
    calibrator = MaxCalibrator(8, (0, 1), False)
    a = torch.tensor([[1.0, -4.0], [float("nan"), 0.5]])
    calibrator.collect(a)
    calibrator.collect(torch.tensor([[-2.0, 1.0], [3.0, 0.25]]))
    assert torch.equal(calibrator.compute_amax().reshape(2, 2), torch.tensor([[2.0, 4.0], [3.0, 0.5]]))


def test_shape_change_is_an_error():
    calibrator = MaxCalibrator(8, 0, False)
    calibrator.collect(torch.rand(3, 4))
    with pytest.raises(RuntimeError, match="shape changed"):
        calibrator.collect(torch.rand(5, 4))


def test_nan_and_inf_are_left_out_and_counted():
    calibrator = MaxCalibrator(8, None, False)
    calibrator.collect(torch.tensor([1.0, float("nan"), -3.0, float("inf"), -float("inf")]))
    assert calibrator.compute_amax().item() == 3.0
    assert calibrator.nonfinite_count == 3
    per_channel = MaxCalibrator(8, 0, False)
    per_channel.collect(torch.tensor([[1.0, float("nan")], [2.0, -5.0]]))
    assert per_channel.compute_amax().flatten().tolist() == [1.0, 5.0]
    assert per_channel.nonfinite_count == 1


def test_track_amax_and_reset():
    calibrator = MaxCalibrator(8, None, False, track_amax=True)
    calibrator.collect(torch.tensor([1.0]))
    calibrator.collect(torch.tensor([2.0]))
    assert [float(a) for a in calibrator.amaxs] == [1.0, 2.0]
    calibrator.reset()
    assert calibrator.compute_amax() is None and calibrator.batches_seen == 0


def test_state_round_trip():
    calibrator = MaxCalibrator(8, 0, False)
    calibrator.collect(torch.randn(3, 4))
    restored = MaxCalibrator(8, 0, False)
    restored.load_state(calibrator.state())
    assert torch.equal(restored.compute_amax(), calibrator.compute_amax())
    assert isinstance(calibrator.state()["calib_amax"], np.ndarray)
    with pytest.raises(ValueError, match="MaxCalibrator"):
        restored.load_state({"kind": "histogram"})


def test_an_unchanged_weight_is_counted_without_rereading_it_and_activations_are_not_kept():
    calib = MaxCalibrator(8, None, False)
    weight = torch.nn.Parameter(torch.tensor([1.0, -3.0]))
    calib.collect(weight)
    calib.collect(weight)  # the same Parameter, unchanged: counted, max unchanged
    assert calib.compute_amax() == 3.0 and calib._batches_seen == 2
    with torch.no_grad():
        weight[0] = 5.0  # changed in place: its version moves, so it is read again
    calib.collect(weight)
    assert calib.compute_amax() == 5.0

    activation = torch.full((1000,), 7.0)
    address = activation.untyped_storage().data_ptr()
    calib.collect(activation)
    del activation
    gc.collect()
    # the calibrator holds no view of the activation's memory after its batch
    assert address not in {t.untyped_storage().data_ptr() for t in _tensors_reachable_from(calib)}
    assert calib.compute_amax() == 7.0


def _tensors_reachable_from(root: object) -> list[torch.Tensor]:
    """Every tensor the object keeps alive through strong references (weak ones don't count).

    Walking from the calibrator, rather than scanning gc.get_objects(), keeps the check to real
    tensors: other tests leave fake tensors around whose data_ptr() raises.
    """
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    pending = [root]
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, (type, weakref.ref)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            continue
        pending.extend(gc.get_referents(obj))
    return found


# ----- the per-tensor fast path (two reductions read back as floats) against the straightforward computation


def _straightforward(tensors):
    """amax = max |x| over the finite values of every tensor (float32), and the NaN/Inf count."""
    finite = [t.double()[torch.isfinite(t.double())] for t in tensors]
    amax = max(float(f.abs().max()) if f.numel() else 0.0 for f in finite)
    return torch.tensor(amax, dtype=torch.float64).float(), sum(t.numel() - f.numel() for t, f in zip(tensors, finite))


def _attention_like(generator, dtype):
    """4-D and 5-D views as attention code makes them: permuted, unbound, transposed (not contiguous)."""
    qkv = torch.randn(2, 9, 3, 4, 8, generator=generator).to(dtype) * 3
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return [qkv.permute(2, 0, 3, 1, 4), q, k.transpose(-2, -1), v, torch.randn(3, 5, generator=generator).to(dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_per_tensor_amax_equals_the_straightforward_max_on_random_and_nonfinite_inputs(dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    tensors = _attention_like(generator, dtype)
    if seed % 2:  # NaN / Inf at random places in some batches, between clean ones
        for index, value in ((1, float("nan")), (2, float("inf")), (3, -float("inf"))):
            flat = tensors[index].reshape(-1).clone()
            flat[torch.randint(flat.numel(), (3,), generator=generator)] = value
            tensors[index] = flat.reshape(tensors[index].shape)
    calibrator = MaxCalibrator(8, None, False)
    for tensor in tensors:
        calibrator.collect(tensor)
    amax, nonfinite = _straightforward(tensors)
    assert calibrator.compute_amax().dtype == torch.float32 and calibrator.compute_amax().dim() == 0
    assert torch.equal(calibrator.compute_amax(), amax)
    assert calibrator.nonfinite_count == nonfinite
    assert (calibrator.batches_seen, calibrator.values_seen) == (len(tensors), sum(t.numel() for t in tensors))


def test_float64_max_is_rounded_to_float32_once_as_before():
    calibrator = MaxCalibrator(8, None, False)
    just_above_one = 1.0 + 2.0 ** -30  # not a float32: rounds to 1.0
    calibrator.collect(torch.tensor([just_above_one], dtype=torch.float64))
    calibrator.collect(torch.tensor([-1.0], dtype=torch.float32))
    assert calibrator.compute_amax().item() == 1.0 and calibrator.compute_amax().dtype == torch.float32


@pytest.mark.parametrize("order", ["grows after a NaN batch", "stays after a NaN batch", "after a loaded state"])
def test_the_running_max_is_right_whichever_path_wrote_it_last(order):
    calibrator = MaxCalibrator(8, None, False)
    calibrator.collect(torch.tensor([1.0, -2.0]))  # per-tensor path
    if order == "after a loaded state":
        calibrator.load_state({"kind": "max", "calib_amax": np.float32(6.0), "batches_seen": 1, "values_seen": 2})
    else:
        calibrator.collect(torch.tensor([float("nan"), -6.0]))  # NaN: the general path writes the max
    calibrator.collect(torch.tensor([7.0]) if order == "grows after a NaN batch" else torch.tensor([3.0]))
    expected = 7.0 if order == "grows after a NaN batch" else 6.0
    assert calibrator.compute_amax().item() == expected


def test_an_integer_or_empty_input_takes_the_general_path():
    calibrator = MaxCalibrator(8, None, False)
    calibrator.collect(torch.tensor([3, -9], dtype=torch.int32))
    assert calibrator.compute_amax().item() == 9.0
    with pytest.raises(ValueError, match="empty"):
        calibrator.collect(torch.zeros(0))


def test_per_tensor_then_per_axis_shape_is_still_an_error():
    calibrator = MaxCalibrator(8, None, False)
    calibrator.load_state({"kind": "max", "calib_amax": np.ones((3, 1), dtype=np.float32)})
    with pytest.raises(RuntimeError, match="shape changed"):
        calibrator.collect(torch.ones(3, 4))


def test_a_parameter_that_requires_grad_is_read_without_building_a_graph():
    weight = torch.nn.Parameter(torch.tensor([[0.5, -4.0]]))
    calibrator = MaxCalibrator(8, None, False)
    calibrator.collect(weight)
    assert calibrator.compute_amax().item() == 4.0 and not calibrator.compute_amax().requires_grad


def test_extremes_show_a_nan_or_inf_wherever_it_is():
    from workbench.quant.calib.max import extremes

    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        for size in (1, 9, 33, 300):
            base = torch.randn(size).to(dtype)
            for position in range(size):
                for value in (float("nan"), float("inf"), -float("inf")):
                    x = base.clone()
                    x[position] = value
                    high, low = extremes(x)
                    assert not (np.isfinite(high) and np.isfinite(low)), (dtype, size, position, value)


@pytest.mark.skipif(memory.cpu_extension is None, reason="C kernel not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("portable", [False, True])
def test_one_pass_abs_max_equals_torch_reductions(dtype, portable):
    """The C kernel's largest finite |x| and NaN/Inf count (AVX2 and portable loops, tails shorter than a
    vector, rows of a sliced view read in place) equal torch's on the same values."""
    generator = torch.Generator().manual_seed(2)
    fused = torch.randn(3, 37, 3 * 70, generator=generator) * 5
    fused[1, 2, 75] = -300.0  # the largest |x| is negative, inside the keys
    cases = [fused, fused[..., 70:140], fused[:, 0], torch.randn(1_100_003, generator=generator),
             torch.tensor([0.0, -0.0]), torch.tensor([float("nan"), float("inf"), -2.5] * 5),
             torch.full((9,), -float("inf"))]
    from workbench.quant.kernels import _cpu_kernels

    _cpu_kernels.force_portable(portable)
    try:
        for x in cases:
            x = x.to(dtype)
            found = memory.abs_max_in_place(x)
            assert found is not None
            finite = x[torch.isfinite(x)].float().abs()
            assert found == (float(finite.max()) if finite.numel() else 0.0, int((~torch.isfinite(x)).sum()))
    finally:
        _cpu_kernels.force_portable(False)
    assert memory.abs_max_in_place(fused[..., :5]) is None  # rows too short: torch's reductions instead
    assert memory.abs_max_in_place(fused.double()) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_tensor_max_with_and_without_the_kernel(dtype, monkeypatch):
    """The per-tensor calibrator's amax, NaN/Inf count and counters are the same whether the kernel or torch
    reads the batches (a transposed attention tensor, a batch with NaN that goes to the general path)."""
    generator = torch.Generator().manual_seed(4)
    probs = torch.softmax(torch.randn(2, 3, 33, 33, generator=generator), -1).to(dtype)
    batches = [probs.transpose(-2, -1), probs * 3, torch.tensor([1.0, float("nan"), -7.0]).to(dtype), probs]

    def run():
        calibrator = MaxCalibrator(8, None, False)
        for batch in batches:
            calibrator.collect(batch)
        return calibrator.compute_amax(), calibrator.nonfinite_count, calibrator.batches_seen, calibrator.values_seen

    fast = run()
    monkeypatch.setattr(memory, "cpu_extension", None)
    slow = run()
    assert torch.equal(fast[0], slow[0]) and fast[1:] == slow[1:]
    assert float(fast[0]) == 7.0 and fast[1] == 1


@pytest.mark.skipif(memory.cpu_extension is None, reason="C kernel not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("portable", [False, True])
def test_per_channel_weight_max_with_and_without_the_kernel(dtype, portable, monkeypatch):
    """A weight's max per output channel (axis 0) from one pass of the C kernel equals torch's reductions: linear
    and convolution weights, rows shorter than a vector and with a tail, a channel holding NaN/Inf, a channel of
    nothing but NaN/Inf (amax 0), negative zeros, a weight large enough for threads, and a second batch that
    raises some channels. Other layouts (axis 1, a transposed view, float64) keep torch's path."""
    from workbench.quant.kernels import _cpu_kernels

    generator = torch.Generator().manual_seed(8)
    linear = torch.randn(37, 19, generator=generator) * torch.logspace(-3, 3, 37).unsqueeze(1)
    linear[4, 18] = float("nan")  # the tail of a row
    linear[5, 0] = -float("inf")
    linear[6] = float("nan")  # a channel with no finite value
    linear[7] = -0.0
    conv = torch.randn(16, 3, 3, 3, generator=generator)
    conv[2, 1, 1, 1] = -40.0
    big = torch.randn(300, 4001, generator=generator)  # > 2**20 values: threads
    cases = [(linear, linear * 2), (conv, conv.flip(0)), (big, big * 0.5), (torch.randn(5, 8), torch.randn(5, 8))]

    def run():
        results = []
        for first, second in cases:
            calibrator = MaxCalibrator(8, 0, False)
            calibrator.collect(first.to(dtype))
            calibrator.collect(second.to(dtype))
            results.append((calibrator.compute_amax(), calibrator.nonfinite_count, calibrator.values_seen))
        return results

    _cpu_kernels.force_portable(portable)
    try:
        fast = run()
        assert memory.abs_max_per_channel(linear.to(dtype)) is not None
        assert memory.abs_max_per_channel(linear.t()) is None and memory.abs_max_per_channel(linear.double()) is None
    finally:
        _cpu_kernels.force_portable(False)
    monkeypatch.setattr(memory, "cpu_extension", None)
    slow = run()
    for (fast_amax, *fast_counts), (slow_amax, *slow_counts) in zip(fast, slow):
        assert fast_amax.dtype == slow_amax.dtype == torch.float32 and fast_amax.shape == slow_amax.shape
        assert torch.equal(fast_amax, slow_amax) and fast_counts == slow_counts
    assert float(fast[0][0][6, 0]) == 0.0 and fast[0][1] == 2 * (19 + 2)
