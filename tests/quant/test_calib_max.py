"""MaxCalibrator: running abs max per tensor and per axis, NaN/Inf accounting, saved state."""
import gc
import weakref

import numpy as np
import pytest
import torch

from workbench.quant.calib import MaxCalibrator


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
