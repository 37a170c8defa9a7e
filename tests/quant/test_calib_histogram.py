"""HistogramCalibrator: collection, range growth, the amax searches against straightforward references."""
import numpy as np
import pytest
import torch

from workbench.quant.calib import HistogramCalibrator, UnknownMethodError, amax_search, histogram, reference

RNG = np.random.default_rng(1234)


def synthetic_histograms():
    """(name, counts, edges): the shapes calibration meets, plus degenerate ones."""
    n = 2048
    yield "normal", *np.histogram(np.abs(RNG.normal(size=50_000)), bins=n)
    yield "heavy-tailed", *np.histogram(np.abs(RNG.standard_t(2, size=50_000)), bins=n)
    yield "relu", *np.histogram(np.maximum(RNG.normal(size=50_000), 0), bins=n)
    spike = np.zeros(n, dtype=np.int64)
    spike[700] = 5000
    yield "single spike", spike, np.linspace(0, 3, n + 1)
    zeros = np.zeros(n, dtype=np.int64)
    zeros[0] = 5000
    yield "all zero", zeros, np.linspace(0, 1, n + 1)
    yield "short", *np.histogram(np.abs(RNG.laplace(size=5000)), bins=300)


def collected_histograms():
    """Histograms as the calibrator builds them (power-of-two bins, trimmed at the max)."""
    for name, data in (("normal", RNG.normal(size=80_000)), ("heavy-tailed", RNG.standard_t(2, size=80_000)),
                       ("relu", np.maximum(RNG.normal(size=80_000), 0) * 3)):
        calibrator = HistogramCalibrator(8, None, False)
        calibrator.collect(torch.from_numpy(data.astype(np.float32)))
        yield f"collected {name}", calibrator.calib_hist.numpy(), calibrator.calib_bin_edges.double().numpy()


ALL = list(synthetic_histograms()) + list(collected_histograms())


@pytest.mark.parametrize("name, hist, edges", ALL, ids=[h[0] for h in ALL])
@pytest.mark.parametrize("unsigned", [False, True])
@pytest.mark.parametrize("stride", [1, 7])
def test_vectorised_searches_equal_the_references(name, hist, edges, unsigned, stride):
    width = edges[1] - edges[0]
    fast = histogram.amax_entropy(hist, edges, 8, unsigned, stride=stride)
    slow = reference.entropy_reference(hist, edges, 8, unsigned, stride=stride)
    assert abs(fast - slow) <= width, f"entropy {fast} vs {slow}"
    fast = histogram.amax_mse(hist, edges, 8, unsigned, stride=stride)
    slow = reference.mse_reference(hist, edges, 8, unsigned, stride=stride)
    assert abs(fast - slow) <= width, f"mse {fast} vs {slow}"
    for p in (50.0, 99.0, 99.99, 100.0):
        assert histogram.amax_percentile(hist, edges, p) == reference.percentile_reference(hist, edges, p)


@pytest.mark.parametrize("name, hist, edges", ALL[:4], ids=[h[0] for h in ALL[:4]])
def test_numpy_fallback_equals_compiled_search(name, hist, edges, monkeypatch):
    compiled = (amax_search.amax_entropy(hist, edges, 8, False), amax_search.amax_mse(hist, edges, 8, False))
    monkeypatch.setattr(amax_search, "cpu_kernels", None)
    assert (amax_search.amax_entropy(hist, edges, 8, False), amax_search.amax_mse(hist, edges, 8, False)) == compiled


def test_search_needs_more_bins_than_start_bin():
    hist, edges = np.histogram(RNG.random(100), bins=64)
    with pytest.raises(ValueError, match="start_bin"):
        histogram.amax_entropy(hist, edges, 8, False)


def test_fp8_histograms_search_on_the_e4m3_grid():
    # entropy and mse score candidates on FP8 E4M3's own grid (tests/quant/test_precision.py checks the values)
    calibrator = HistogramCalibrator((4, 3), None, False)
    calibrator.collect(torch.randn(10000))
    for method in ("entropy", "mse"):
        assert 0 < float(calibrator.compute_amax(method)) <= float(calibrator.compute_amax("max"))


class TestCollection:
    def test_growth_gives_the_histogram_of_all_data_at_once(self):
        batches = [torch.randn(5000) * scale for scale in (0.5, 3.0, 1.0, 40.0, 2.0)]
        incremental = HistogramCalibrator(8, None, False)
        for batch in batches:
            incremental.collect(batch)
        at_once = HistogramCalibrator(8, None, False)
        at_once.collect(torch.cat(batches))
        reordered = HistogramCalibrator(8, None, False)
        for batch in reversed(batches):
            reordered.collect(batch)
        assert torch.equal(incremental.calib_hist, at_once.calib_hist)
        assert torch.equal(incremental.calib_bin_edges, at_once.calib_bin_edges)
        assert torch.equal(reordered.calib_hist, at_once.calib_hist)
        assert int(at_once.calib_hist.sum()) == 25000

    def test_bins_cover_the_data_with_at_least_num_bins(self):
        calibrator = HistogramCalibrator(8, None, False, num_bins=2048)
        calibrator.collect(torch.tensor([0.0, 1.0, 255.0, 256.0]))
        hist, edges = calibrator.calib_hist, calibrator.calib_bin_edges
        assert hist.numel() + 1 == edges.numel()
        assert 2048 < hist.numel() <= 4097
        assert edges[-2] <= 256.0 < edges[-1]  # the last bin holds the max

    def test_nan_and_inf_are_left_out_and_counted(self):
        calibrator = HistogramCalibrator(8, None, False)
        x = torch.randn(1000)
        x[[3, 10, 99]] = torch.tensor([float("nan"), float("inf"), -float("inf")])
        calibrator.collect(x)
        assert calibrator.nonfinite_count == 3
        assert int(calibrator.calib_hist.sum()) == 997
        assert float(calibrator.compute_amax("max")) == float(x[torch.isfinite(x)].abs().max())

    def test_skip_zeros(self):
        calibrator = HistogramCalibrator(8, None, False, skip_zeros=True)
        calibrator.collect(torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0]))
        assert int(calibrator.calib_hist.sum()) == 2

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("with_nan", [True, False])  # False: the torch path's no-filtering branch
    def test_compiled_collection_equals_torch_collection(self, dtype, with_nan, monkeypatch):
        x = torch.relu(torch.randn(20000) * 4).to(dtype)
        if with_nan:
            x[7] = float("nan")
        x[8] = -0.0  # a skipped zero too
        fast = HistogramCalibrator(8, None, False, skip_zeros=True)
        fast.collect(x)
        fast.collect(x * 3)
        monkeypatch.setattr(histogram, "cpu_kernels", None)
        slow = HistogramCalibrator(8, None, False, skip_zeros=True)
        slow.collect(x)
        slow.collect(x * 3)
        assert torch.equal(fast.calib_hist, slow.calib_hist)
        assert int(slow.calib_hist.sum()) == 2 * int((x != 0).sum()) - 2 * with_nan  # NaN != 0 is True
        assert fast.nonfinite_count == slow.nonfinite_count == 2 * with_nan

    @pytest.mark.skipif(histogram.cpu_kernels is None, reason="C kernel not built")
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("skip_zeros", [False, True])
    def test_one_pass_collection_equals_max_first_collection(self, dtype, skip_zeros, monkeypatch):
        """The kernel bins and tracks the max in one pass and re-bins only when the range grows (a batch
        beyond the bins, several doublings at once, NaN/Inf beyond the range, a batch of zeros, a
        multi-threaded batch): the histogram, width, max and NaN/Inf count equal those of the torch path,
        which takes every batch's max first."""
        scales = (0.5, 0.7, 3.0, 1.0, 400.0, 0.0, 401.0, 2.0)
        batches = [torch.relu(torch.randn(3001) * scale) - torch.randn(3001) * scale / 3 for scale in scales]
        batches[4][[5, 6]] = torch.tensor([float("nan"), -float("inf")])
        batches.append(torch.randn(1_100_000) * 300)  # > 2**20 values: threads
        batches = [b.to(dtype) for b in batches]
        widths = []
        fast = HistogramCalibrator(8, None, False, skip_zeros=skip_zeros)
        for batch in batches:
            fast.collect(batch)
            widths.append(fast.bin_width)
        assert len(set(widths)) >= 3  # the range really grew, more than once
        monkeypatch.setattr(histogram, "cpu_kernels", None)
        slow = HistogramCalibrator(8, None, False, skip_zeros=skip_zeros)
        for batch in batches:
            slow.collect(batch)
        assert torch.equal(fast._counts, slow._counts) and fast.bin_width == slow.bin_width
        assert torch.equal(fast.max_value, slow.max_value)
        assert fast.nonfinite_count == slow.nonfinite_count == 2
        for method in ("entropy", "mse", "percentile"):
            assert torch.equal(fast.compute_amax(method), slow.compute_amax(method)), method

    @pytest.mark.skipif(histogram.cpu_kernels is None, reason="C kernel not built")
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("portable", [False, True])
    def test_kernel_widening_within_a_batch_equals_the_reference(self, dtype, portable, monkeypatch):
        """Values that grow along a batch make the kernel widen its bins block after block inside one pass (and
        in each thread differently); its histogram, width, max and NaN/Inf count equal those of the torch
        reference, which takes the max first. Both the AVX2 and the portable loops, tails shorter than a
        vector included; tiny, huge (bins that overflow float32 at the top) and negative zero values too, and
        a bin that receives more than its 16-bit private counts hold."""
        from workbench.quant.kernels import _cpu_kernels

        generator = torch.Generator().manual_seed(11)
        ramp = torch.randn(50_003, generator=generator) * torch.logspace(-6, 6, 50_003)  # grows ~40 doublings
        threaded = torch.randn(1_200_001, generator=generator) * torch.linspace(0, 1e4, 1_200_001)  # > 2**20: threads
        threaded[[17, 800_000]] = torch.tensor([float("nan"), float("inf")])
        extremes = torch.tensor([0.0, -0.0, 1e-30, -1e-38, 3.0e38, -3.3e38, 1.0] * 3)
        # one thread, far more than a 16-bit count per bin (0.5 then 3.0, a widening after several flushes)
        plateau = torch.cat([torch.full((600_000,), -0.5), torch.full((400_000,), 3.0)])
        batches = [b.to(dtype) for b in (ramp, threaded, ramp.flip(0) * 7, extremes, plateau)]
        _cpu_kernels.force_portable(portable)
        try:
            fast = [HistogramCalibrator(8, None, False, skip_zeros=True) for _ in batches]
            for calibrator, batch in zip(fast, batches):
                calibrator.collect(batch[: batch.numel() // 3])
                calibrator.collect(batch)
        finally:
            _cpu_kernels.force_portable(False)
        monkeypatch.setattr(histogram, "cpu_kernels", None)
        for calibrator, batch in zip(fast, batches):
            slow = HistogramCalibrator(8, None, False, skip_zeros=True)
            slow.collect(batch[: batch.numel() // 3])
            slow.collect(batch)
            assert torch.equal(calibrator._counts, slow._counts) and calibrator.bin_width == slow.bin_width
            assert torch.equal(calibrator.max_value, slow.max_value)
            assert calibrator.nonfinite_count == slow.nonfinite_count

    @pytest.mark.skipif(histogram.cpu_kernels is None, reason="C kernel not built")
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("portable", [False, True])
    def test_blocks_with_nan_inf_zeros_and_growth_at_every_place_equal_the_reference(self, dtype, portable,
                                                                                     monkeypatch):
        """The kernel counts a block straight away only when its largest |x| lies within the bins; a block with
        a value beyond them widens first, one with NaN/Inf takes the careful path. Each case is put at the
        places where the loops change: a block's first and last value, the last full vector, the tail after
        it, a row's end (rows of 67 values read in place), in the first block of a call and in a later
        one, with skipped zeros around them. Counts, width, max, NaN/Inf and zero counts equal those of the
        torch reference, in the AVX2 and the portable loops."""
        from workbench.quant.kernels import _cpu_kernels

        generator = torch.Generator().manual_seed(21)
        places = (0, 7, 8, 503, 504, 510, 511, 512, 519, 1023, 1024 + 66, 2047)
        cases = []
        for kind in ("nan", "inf", "big", "nan+big", "zeros"):
            for place in places:
                x = torch.randn(2053, generator=generator)
                x[::5] = 0.0  # skipped zeros in every block, NaN ones included
                if kind in ("nan", "nan+big"):
                    x[place] = float("nan")
                if kind == "inf":
                    x[place] = -float("inf")
                if kind in ("big", "nan+big"):
                    x[min(place + 3, x.numel() - 1)] = 1e4  # beyond the bins set by the first block
                cases.append(x.to(dtype))
        # rows of 67 values, 80 apart: blocks end at every row's end (tails of 3 after 8 vectors)
        strided = torch.randn(40, 80, generator=generator)
        strided[5, 66] = float("nan")
        strided[30, 0] = 500.0
        assert histogram.memory_rows(strided[:, :67]) == (67, 80)
        pairs = [(x * 0.01, x) for x in cases + [strided[:, :67]]]  # a range, then a call that must grow it
        # a value exactly at the top of the bins (4096 bins of 2**-11 after a max of 1.0) must widen them too
        for place in places:
            at_limit = torch.rand(2053, generator=generator).to(dtype)
            at_limit[place] = 2.0
            pairs.append((torch.tensor([1.0, 0.5], dtype=dtype), at_limit))

        def run() -> list[HistogramCalibrator]:
            calibrators = []
            for first, second in pairs:
                calibrator = HistogramCalibrator(8, None, False, skip_zeros=True)
                calibrator.collect(first)
                calibrator.collect(second)
                calibrators.append(calibrator)
            return calibrators

        _cpu_kernels.force_portable(portable)
        try:
            fast = run()
        finally:
            _cpu_kernels.force_portable(False)
        monkeypatch.setattr(histogram, "cpu_kernels", None)
        for index, (calibrator, slow) in enumerate(zip(fast, run())):
            assert torch.equal(calibrator._counts, slow._counts), index
            assert calibrator.bin_width == slow.bin_width, index
            assert calibrator.max_value == slow.max_value and calibrator.nonfinite_count == slow.nonfinite_count, index

    @pytest.mark.skipif(histogram.cpu_kernels is None, reason="C kernel not built")
    def test_calibrators_of_different_sizes_in_turn_equal_the_reference(self, monkeypatch):
        """The kernel keeps its per-thread counting buffer between calls: calibrators with other numbers of
        bins (a larger buffer, then smaller ones, then more than the buffer keeps) see nothing of each other."""
        generator = torch.Generator().manual_seed(3)
        data = [torch.randn(9000, generator=generator) * scale for scale in (1.0, 50.0, 0.01)]
        sizes = (2048, 100, 5, 2048, 40_000)

        def run():
            calibrators = [HistogramCalibrator(8, None, False, num_bins=size) for size in sizes]
            for batch in data:
                for calibrator in calibrators:
                    calibrator.collect(batch)
            return [(c._counts.clone(), c.bin_width) for c in calibrators]

        fast = run()
        monkeypatch.setattr(histogram, "cpu_kernels", None)
        for (fast_counts, fast_width), (slow_counts, slow_width) in zip(fast, run()):
            assert torch.equal(fast_counts, slow_counts) and fast_width == slow_width

    def test_memory_rows_of_views(self):
        qkv = torch.zeros(2, 65, 3 * 192)
        keys = qkv[..., 192:384].reshape(2, 65, 3, 64).permute(0, 2, 3, 1)  # a slice of the fused projection
        assert histogram.memory_rows(keys) == (192, 576)
        assert histogram.memory_rows(qkv[:, 0]) == (576, 65 * 576)  # the class token of every sequence
        assert histogram.memory_rows(qkv.transpose(0, 1)) == (qkv.numel(), qkv.numel())  # a dense block: one row
        assert histogram.memory_rows(qkv[:, :, :8]) is None  # rows too short to read in place
        assert histogram.memory_rows(qkv[:, ::2, :]) is None  # rows not evenly spaced in both dims
        assert histogram.memory_rows(torch.zeros(1, 200).expand(4, 200)) is None  # overlapping rows
        assert histogram.memory_rows(torch.zeros(4, 100)[:, :64]) == (64, 100)

    @pytest.mark.skipif(histogram.cpu_kernels is None, reason="C kernel not built")
    def test_kernel_refuses_rows_that_do_not_fit(self):
        x = torch.zeros(10)
        counts = torch.zeros(8, dtype=torch.int64)
        with pytest.raises(ValueError, match="row_length"):
            histogram.cpu_kernels.histogram(x.data_ptr(), 0, 10, 3, 3, 0, -35, 8, False, counts.data_ptr(), 1)
        with pytest.raises(ValueError, match="row_step"):
            histogram.cpu_kernels.histogram(x.data_ptr(), 0, 10, 5, 4, 0, -35, 8, False, counts.data_ptr(), 1)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
    @pytest.mark.parametrize("nonfinite", [False, True])
    def test_attention_views_give_the_histogram_of_their_values_copied_out(self, dtype, nonfinite):
        """Permuted, transposed, unbound and sliced views (read in place when they fill one block of memory or
        evenly spaced rows of it) count exactly what a contiguous copy of the same values counts; NaN/Inf are
        left out either way."""
        generator = torch.Generator().manual_seed(5)
        qkv = (torch.randn(2, 17, 3, 4, 16, generator=generator) * 2).to(dtype)
        if nonfinite:
            qkv.view(-1)[[5, 900, 3000]] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        probs = torch.softmax(q.float() @ k.float().transpose(-2, -1), dim=-1).to(dtype)
        fused = (torch.randn(2, 17, 3 * 4 * 16, generator=generator) * 3).to(dtype)  # one qkv projection output
        if nonfinite:
            fused.view(-1)[[70, 1000]] = torch.tensor([float("nan"), -float("inf")], dtype=dtype)
        keys = fused[..., 64:128].reshape(2, 17, 4, 16).permute(0, 2, 3, 1)  # rows of 64 values, 192 apart
        views = [qkv.permute(2, 0, 3, 1, 4), (q * 0.5).transpose(1, 2), k.transpose(-2, -1), v, probs.transpose(-2, -1),
                 keys, fused[:, 0], fused[..., :4]]
        assert histogram.dense_block(views[0]) and histogram.dense_block(views[1])
        assert not histogram.dense_block(views[2]) and not histogram.dense_block(qkv[:, :, :1])
        assert histogram.memory_rows(keys) == (64, 192) and histogram.memory_rows(fused[..., :4]) is None
        in_place, copied = HistogramCalibrator(8, None, False), HistogramCalibrator(8, None, False)
        for view in views:
            in_place.collect(view)
            copied.collect(view.contiguous().clone())
        assert torch.equal(in_place.calib_hist, copied.calib_hist)
        assert in_place.nonfinite_count == copied.nonfinite_count == sum(
            int((~torch.isfinite(view)).sum()) for view in views)
        values = torch.cat([view.double().reshape(-1) for view in views])
        finite = values[torch.isfinite(values)].abs()
        assert int(in_place.calib_hist.sum()) == finite.numel()
        assert float(in_place.compute_amax("max")) == float(finite.max().float())

    def test_the_running_max_survives_a_loaded_state_and_a_smaller_batch(self):
        calibrator = HistogramCalibrator(8, None, False)
        calibrator.collect(torch.tensor([1.0, -3.0]))
        restored = HistogramCalibrator(8, None, False)
        restored.load_state(calibrator.state())
        restored.collect(torch.tensor([0.5]))
        assert float(restored.compute_amax("max")) == 3.0
        restored.collect(torch.tensor([-5.0]))
        assert float(restored.compute_amax("max")) == 5.0
        restored.reset()
        restored.collect(torch.tensor([0.25]))
        assert float(restored.compute_amax("max")) == 0.25

    def test_only_zeros(self):
        calibrator = HistogramCalibrator(8, None, False)
        calibrator.collect(torch.zeros(100))
        for method in ("entropy", "mse", "percentile", "max"):
            assert float(calibrator.compute_amax(method)) == 0.0

    def test_nothing_collected(self):
        calibrator = HistogramCalibrator(8, None, False)
        assert calibrator.compute_amax("entropy") is None
        assert calibrator.calib_hist is None

    def test_state_round_trip(self):
        calibrator = HistogramCalibrator(8, None, True)
        calibrator.collect(torch.relu(torch.randn(10000)))
        calibrator.collect(torch.relu(torch.randn(10000)) * 5)
        restored = HistogramCalibrator(8, None, True)
        restored.load_state(calibrator.state())
        assert torch.equal(restored.calib_hist, calibrator.calib_hist)
        for method in ("entropy", "mse", "percentile", "max"):
            assert torch.equal(restored.compute_amax(method), calibrator.compute_amax(method))
        assert restored.batches_seen == 2

    def test_bad_state_is_refused(self):
        state = HistogramCalibrator(8, None, False).state()
        state["counts"] = np.ones(10, dtype=np.int64)
        state["width_exponent"] = -3
        state["max_value"] = 1.0
        with pytest.raises(ValueError, match="counts"):
            HistogramCalibrator(8, None, False).load_state(state)

    def test_argument_errors(self):
        calibrator = HistogramCalibrator(8, None, False)
        calibrator.collect(torch.randn(1000))
        with pytest.raises(UnknownMethodError, match="Unknown calibration method"):
            calibrator.compute_amax("kl")
        with pytest.raises(ValueError, match="range"):
            calibrator.compute_amax("percentile", percentile=120)
        with pytest.raises(ValueError, match="stride"):
            calibrator.compute_amax("entropy", stride=0)
        with pytest.raises(NotImplementedError, match="per tensor"):
            HistogramCalibrator(8, 0, False)


def test_every_method_gives_a_distinct_sensible_amax_on_heavy_tailed_data():
    """Peers shipped 'entropy' equal to max and an mse collapsed to max/20: guard against both."""
    data = torch.from_numpy(RNG.standard_t(3, size=200_000).astype(np.float32))
    calibrator = HistogramCalibrator(8, None, False)
    calibrator.collect(data)
    amax = {m: float(calibrator.compute_amax(m)) for m in ("max", "entropy", "mse", "percentile")}
    assert len(set(amax.values())) == 4, amax
    assert amax["max"] == float(data.abs().max())
    for method in ("entropy", "mse", "percentile"):
        # clips the tail: well below the max, well above the bulk of the data
        assert float(torch.quantile(data.abs()[:100_000], 0.99)) < amax[method] < amax["max"] * 0.8, (method, amax)


class TestCalibrateWeights:
    def _model(self):
        torch.manual_seed(0)
        from workbench.quant import nn as quant_nn

        return torch.nn.Sequential(quant_nn.QuantConv2d(3, 4, 3), quant_nn.QuantConvTranspose2d(4, 5, 3))

    def test_max_per_channel_follows_the_output_axis(self):
        model = self._model()
        histogram.calibrate_weights(model, method="max")
        conv, deconv = model
        assert torch.equal(conv.weight_quantizer.amax, conv.weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True))
        assert torch.equal(deconv.weight_quantizer.amax,
                           deconv.weight.detach().abs().amax(dim=(0, 2, 3), keepdim=True))

    def test_max_per_tensor_and_percentile(self):
        model = self._model()
        histogram.calibrate_weights(model, method="max", perchannel=False)
        assert model[0].weight_quantizer.amax.item() == model[0].weight.detach().abs().max().item()
        model = self._model()
        histogram.calibrate_weights(model, method="percentile", percentile=50.0)
        amax = model[0].weight_quantizer.amax
        assert amax.shape == (4, 1, 1, 1)
        assert (amax < model[0].weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True)).all()

    def test_unknown_method(self):
        with pytest.raises(UnknownMethodError, match="Unsupported calibration method 'entropy'"):
            histogram.calibrate_weights(self._model(), method="entropy")
