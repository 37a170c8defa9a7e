"""merge_calibrators in one process: ranks simulated by threads with an exchange standing in for gloo.

The real collectives are exercised by test_launch.py; here the merge's arithmetic is checked on cases
that are awkward to set up across processes (a rank without data, mismatched calibrators).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from workbench.quant.algorithms.distributed import DistContext, deal, shard
from workbench.quant.algorithms.merge import CalibratorMergeError, merge_calibrators
from workbench.quant.calib import HistogramCalibrator, MaxCalibrator


class ThreadContext(DistContext):
    """A rank of a job whose ranks are threads of this process (all_gather and all_reduce via a barrier)."""

    def __init__(self, rank: int, world_size: int, shared: dict) -> None:
        super().__init__(rank=rank, world_size=world_size, backend="threads")
        self.shared = shared

    def _exchange(self, value):
        barrier = self.shared["barrier"]
        self.shared.setdefault("slots", {})[self.rank] = value
        barrier.wait(timeout=30)
        values = [self.shared["slots"][r] for r in range(self.world_size)]
        barrier.wait(timeout=30)
        return values

    def all_gather(self, value):
        return self._exchange(value)

    def all_reduce(self, tensor, op):
        values = torch.stack(self._exchange(tensor.clone()))
        tensor.copy_(values.amax(0) if op == "max" else values.sum(0))
        return tensor


def run_ranks(world_size: int, job) -> list:
    """``job(context)`` in ``world_size`` threads; their return values in rank order (errors re-raised)."""
    shared = {"barrier": threading.Barrier(world_size)}
    results: list = [None] * world_size
    errors: list = []

    def target(rank: int) -> None:
        try:
            results[rank] = job(ThreadContext(rank, world_size, shared))
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            errors.append(error)
            shared["barrier"].abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    non_barrier = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if non_barrier or errors:
        raise (non_barrier or errors)[0]
    return results


def data(count: int = 6) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    tensors = [torch.randn(3, 50, generator=generator) for _ in range(count)]
    tensors[-1] = tensors[-1] * 100.0  # one rank's range is far wider: its bins are 2**k times wider
    tensors[0][0, 0] = float("nan")
    return tensors


def one_process(tensors) -> tuple[HistogramCalibrator, MaxCalibrator]:
    histogram, maximum = HistogramCalibrator(8, None, False, num_bins=256), MaxCalibrator(8, 0, False)
    for x in tensors:
        histogram.collect(x)
        maximum.collect(x)
    return histogram, maximum


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_merged_statistics_equal_one_process_exactly(world_size):
    tensors = data()
    expected_hist, expected_max = one_process(tensors)

    def job(context):
        histogram, maximum = one_process(shard(tensors, context))
        merge_calibrators({"h": histogram, "m": maximum}, context)
        return histogram, maximum

    for histogram, maximum in run_ranks(world_size, job):
        assert histogram.bin_width == expected_hist.bin_width
        assert torch.equal(histogram.calib_hist, expected_hist.calib_hist)
        assert float(histogram.max_value) == float(expected_hist.max_value)
        for method in ("entropy", "mse", "percentile", "max"):
            assert float(histogram.compute_amax(method)) == float(expected_hist.compute_amax(method)), method
        assert torch.equal(maximum.compute_amax(), expected_max.compute_amax())
        assert maximum.compute_amax().shape == (3, 1)
        for calibrator, expected in ((histogram, expected_hist), (maximum, expected_max)):
            assert calibrator.batches_seen == expected.batches_seen
            assert calibrator.values_seen == expected.values_seen
            assert calibrator.nonfinite_count == expected.nonfinite_count == 1
        assert histogram.state()["width_exponent"] > one_process(tensors[:-1])[0].state()["width_exponent"]


def test_a_rank_without_data_contributes_nothing():
    tensors = data(1)  # two ranks, one batch: rank 1 collects nothing
    expected_hist, expected_max = one_process(tensors)

    def job(context):
        histogram, maximum = one_process(shard(tensors, context))
        merge_calibrators({"h": histogram, "m": maximum}, context)
        return histogram, maximum

    for histogram, maximum in run_ranks(2, job):
        assert torch.equal(histogram.calib_hist, expected_hist.calib_hist)
        assert torch.equal(maximum.compute_amax(), expected_max.compute_amax())
        assert histogram.batches_seen == 1


def test_nobody_collected_stays_empty():
    def job(context):
        histogram, maximum = HistogramCalibrator(8, None, False), MaxCalibrator(8, None, False)
        merge_calibrators({"h": histogram, "m": maximum}, context)
        return histogram.calib_hist, maximum.compute_amax()

    assert run_ranks(2, job) == [(None, None), (None, None)]


def test_ranks_with_different_calibrators_are_refused():
    def job(context):
        calibrator = HistogramCalibrator(8, None, False, num_bins=64 if context.rank == 0 else 128)
        calibrator.collect(torch.ones(4))
        merge_calibrators({"conv._input_quantizer": calibrator}, context)

    with pytest.raises(CalibratorMergeError, match=r"conv\._input_quantizer: .*differ in bins"):
        run_ranks(2, job)


def test_ranks_with_different_models_are_refused():
    def job(context):
        merge_calibrators({f"layer{context.rank}": MaxCalibrator(8, None, False)}, context)

    with pytest.raises(CalibratorMergeError, match="every rank must build the same model"):
        run_ranks(2, job)


def test_single_process_merge_changes_nothing():
    histogram, _ = one_process(data())
    before = histogram.calib_hist.clone()
    merge_calibrators({"h": histogram}, DistContext())
    assert torch.equal(histogram.calib_hist, before)


def test_shard_deals_round_robin():
    items = list(range(7))
    shares = [shard(items, DistContext(rank=r, world_size=3)) for r in range(3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(np.concatenate(shares).tolist()) == items


def test_deal_goes_back_and_forth():
    shares = [deal(8, DistContext(rank=r, world_size=3)) for r in range(3)]
    assert shares == [[0, 5, 6], [1, 4, 7], [2, 3]]
    # a linear cost profile (task i costs 8 - i) splits evenly between two ranks
    two = [deal(8, DistContext(rank=r, world_size=2)) for r in range(2)]
    assert [sum(8 - i for i in share) for share in two] == [18, 18]


class FailsOnMarker(torch.nn.Module):
    """A quantized linear layer that raises on a batch whose first value is the marker 1234."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        # a private generator: thread ranks build their models at the same time, and seeding the global
        # generator from two threads races (each rank then has different weights)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            self.linear.weight.copy_(torch.rand(self.linear.weight.shape, generator=generator) - 0.5)
            self.linear.bias.copy_(torch.rand(self.linear.bias.shape, generator=generator) - 0.5)

    def forward(self, x):
        if float(x.reshape(-1)[0]) == 1234.0:
            raise RuntimeError("bad batch")
        return self.linear(x)


def quantized_model():
    from workbench import quant
    from workbench.quant.tensor_quant import QuantDescriptor

    model = FailsOnMarker()
    quant.replace_to_quantization_module(model, quant_desc_input=QuantDescriptor(calib_method="histogram"))
    return model


def calibration_batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    batches = [torch.randn(8, 4, generator=generator) * (1 + i) for i in range(5)]
    batches[3] = torch.full((8, 4), float("nan"))  # mostly NaN: the warning names batch 3
    return batches


def test_calibrate_in_thread_ranks_equals_one_process():
    from workbench.quant.algorithms.calibrate import calibrate

    expected = calibrate(quantized_model(), calibration_batches(), num_batches=None, method="percentile")

    def job(context):
        return calibrate(quantized_model(), calibration_batches(), num_batches=None, method="percentile",
                         context=context)

    for result in run_ranks(2, job):
        assert result.num_batches == 5
        assert {n: q.amax.tolist() for n, q in result.quantizers.items()} == \
            {n: q.amax.tolist() for n, q in expected.quantizers.items()}
        assert {n: q.nonfinite_count for n, q in result.quantizers.items()} == \
            {n: q.nonfinite_count for n, q in expected.quantizers.items()}
        # the warnings name batches by their place among all the batches, not within a rank's share
        nonfinite = [w for w in result.warnings if "batch" in w and "3" in w]
        assert nonfinite and nonfinite == [w for w in expected.warnings if "batch" in w and "3" in w]


def test_a_failing_batch_is_named_by_its_global_index():
    from workbench.quant.algorithms.calibrate import CalibrationError, calibrate

    batches = calibration_batches()
    batches[3] = torch.full((8, 4), 1234.0)  # rank 1 runs it, as its second batch

    def job(context):
        return calibrate(quantized_model(), batches, num_batches=None, method="max", context=context)

    with pytest.raises(CalibrationError, match="batch 3") as caught:
        run_ranks(2, job)
    assert caught.value.batch_index == 3
