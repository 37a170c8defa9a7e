"""The sweep's results from several runs become one file, one row per architecture, the newest winning
(bench/zoo_sweep.py --merge): the README's table is made from it."""
import json

import zoo_sweep


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_merge_keeps_the_newest_row_of_each_model_in_catalogue_order_and_says_where_it_came_from(tmp_path):
    merged, rerun = tmp_path / "merged.jsonl", tmp_path / "rerun.jsonl"
    _write(merged, [{"model": "hf/sew", "family": "speech", "failure": "weight GEMMs quantized 16/17",
                     "date": "2026-11-29T12:09:33+00:00"},
                    {"model": "hf/llama", "family": "decoder", "date": "2026-11-29T11:00:00+00:00"},
                    {"model": "hf/bert", "family": "encoder"}])  # an old row without a date
    _write(rerun, [{"model": "hf/sew", "family": "speech", "date": "2026-11-29T17:14:06+00:00"},
                   {"model": "hf/llama", "family": "decoder", "failure": "older", "date": "2026-11-29T10:00:00+00:00"},
                   {"model": "hf/bert", "family": "encoder", "date": "2026-11-29T17:00:00+00:00"}])
    zoo_sweep.main(["--merge", str(rerun), "--out", str(merged)])
    rows = [json.loads(line) for line in merged.read_text().splitlines()]
    by_model = {row["model"]: row for row in rows}
    assert len(rows) == 3  # one row per model
    assert "failure" not in by_model["hf/sew"] and by_model["hf/sew"]["source_file"] == "rerun.jsonl"
    assert "failure" not in by_model["hf/llama"] and by_model["hf/llama"]["source_file"] == "merged.jsonl"
    assert by_model["hf/bert"]["source_file"] == "rerun.jsonl"  # a dated row beats one without a date
    order = [entry.name for entry in zoo_sweep.zoo_catalog.all_entries()]
    assert [row["model"] for row in rows] == sorted(by_model, key=order.index)


def test_batchnorm_statistics_set_on_data_normalise_what_a_random_init_lets_vanish():
    """torchvision's random EfficientNetV2 returns logits of ~1e-5 (its activations vanish with depth); the sweep
    builds it with BatchNorm statistics set on images, as training leaves them: each BatchNorm's output then has
    about zero mean and unit variance on such images, whatever the layer before it scaled them by."""
    import torch
    import zoo_factories
    from torch import nn

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3)
    with torch.no_grad():
        conv.weight.mul_(1e-2)  # a layer that shrinks its input 100 times, as a bad init does
    model = nn.Sequential(conv, nn.BatchNorm2d(4))
    zoo_factories.set_batchnorm_statistics(model, size=16)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(8, 3, 16, 16))
    assert abs(float(out.mean())) < 0.1 and 0.8 < float(out.std()) < 1.2
    assert model[1].momentum == 0.1  # the module as built, but for its statistics


def test_an_einsum_of_two_activations_counts_as_an_attention_product(tmp_path):
    """torchvision's MaxViT writes q @ k^T and probabilities @ v as einsums: the sweep counted MatMuls only, found
    0 products in its file and accepted it with 44 float ones."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from zoo_checks import attention_products

    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "s")
    zero = numpy_helper.from_array(np.array(0, dtype=np.int8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["q", "s", "z"], ["q_q"]),
             helper.make_node("DequantizeLinear", ["q_q", "s", "z"], ["q_dq"]),
             helper.make_node("Einsum", ["q_dq", "k"], ["scores"], equation="ij,kj->ik"),  # k is float
             helper.make_node("Einsum", ["scores", "v"], ["out"], equation="ik,kj->ij")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in ("q", "k", "v")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 4])],
                              initializer=[scale, zero])
    path = tmp_path / "einsum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert attention_products(path) == (0, 2)


def test_a_file_not_validated_says_what_the_parity_diagnosis_found_in_the_table_and_its_category():
    """A file written "not validated" whose difference the parity diagnosis explains as rounding (within the model's
    own 1-ulp spread) is accepted, listed apart with both cosines; a wrong graph or an unexplained one is not: the
    README's lists and the failure categories say which it is."""
    rounding = {"model": "timm/coat_lite_tiny", "family": "timm", "export_ok": True, "validated": False,
                "failure": "file not validated (cosine 0.974043)", "parity_verdict": "rounding",
                "parity_sensitivity_cosine": 0.976047}
    operation = {"model": "hf/bert", "family": "encoder", "export_ok": True, "validated": False,
                 "failure": "file not validated (cosine 0.5); attention products quantized 2/4",
                 "parity_verdict": "operation"}
    old = {"model": "hf/gpt2", "family": "decoder", "export_ok": True, "validated": False,
           "failure": "file not validated (cosine 0.9)"}  # a row from before the diagnosis
    assert zoo_sweep.failure_text(rounding) == ("file not validated (cosine 0.974043) (diagnosis: rounding flips "
                                                "accumulating in a sensitive network, its own 1-ulp spread: cosine "
                                                "0.976047)")
    assert zoo_sweep.failure_text(operation) == ("file not validated (cosine 0.5) (diagnosis: an operation computed "
                                                 "differently (a wrong graph)); attention products quantized 2/4")
    assert zoo_sweep.failure_text(old) == old["failure"]
    keys = {zoo_sweep.category(row)[0] for row in (operation, old)}
    assert len(keys) == 2  # two causes, two categories
    for row in (rounding, operation, old):
        row.update(gemms=[2, 2], attention=[0, 0], outputs=[1, 1])
    assert [zoo_sweep.accepted(row) for row in (rounding, operation, old)] == [True, False, False]
    assert zoo_sweep.accepted({**rounding, "parity_verdict": "unexplained"}) is False
    assert zoo_sweep.accepted({**rounding, "gemms": [1, 2]}) is False  # the other checks still hold it back
    table = zoo_sweep.markdown([rounding, operation, old])
    assert "Accept rate **1/3 (33%)**" in table and "0 files validated, 1 written" in table
    accepted_part, _, failed_part = table.partition("Not accepted:")
    assert "- `timm/coat_lite_tiny`: file not validated (cosine 0.974043) (diagnosis: rounding flips" in accepted_part
    assert "hf/bert" in failed_part and "hf/gpt2" in failed_part and "coat_lite" not in failed_part
    assert "coat_lite" not in str(zoo_sweep.categories([rounding, operation, old]))


def _accepted_row(**changes):
    row = {"model": "torchvision/vit_b_16", "family": "torchvision", "export_ok": True, "validated": True,
           "cosine": 1.0, "gemms": [38, 38], "attention": [24, 24], "outputs": [1, 1], "sqnr_db": 17.5}
    row.update(changes)
    return row


def test_a_row_whose_output_is_constant_is_never_accepted_parity_says_nothing():
    """torchvision's ViT (zero head), timm's MLP-Mixer and MobileNets at their initial BatchNorm statistics
    returned one value whatever the input: cosine 1.0 and INT8 SQNR inf (or 0 dB, the INT8 output all zero) were
    accepted although they say nothing. Such a row is a shortfall now, old rows judged on their SQNR."""
    from zoo_checks import shortfalls

    assert zoo_sweep.accepted(_accepted_row())
    assert shortfalls(_accepted_row()) == []
    for changes, reason in (({"sqnr_db": float("inf")}, "INT8 SQNR inf"),
                            ({"sqnr_db": 0.0}, "INT8 SQNR 0 dB: the INT8 output is zero"),
                            ({"sqnr_db": float("nan")}, "INT8 SQNR NaN"),
                            ({"degenerate_output": "float output all zero"}, "float output all zero")):
        row = _accepted_row(**changes)
        assert not zoo_sweep.accepted(row), changes
        assert any(s.startswith("output constant: parity says nothing") and reason in s for s in shortfalls(row))
        # a merged row from before the check has no failure of its own: the table says why it is not accepted
        assert zoo_sweep.failure_text(row).startswith("output constant: parity says nothing")
        assert zoo_sweep.category(row)[0]


def test_constant_output_is_found_in_what_the_model_returns_and_a_revived_head_varies():
    """A zero-initialised head returns its bias for every input; given a random init (as the sweep builds
    torchvision's and timm's models now) it computes something."""
    import torch
    from torch import nn
    from zoo_checks import constant_output
    from zoo_factories import revive_degenerate_weights

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.fill_(0.25)
    images = torch.randn(2, 3, 2, 2)
    assert constant_output(model(images)) == "float output constant (0.25 in every element)"
    assert constant_output({"logits": torch.zeros(2, 5), "ids": torch.arange(4)}) == "float output all zero"
    assert constant_output((torch.zeros(2, 5), torch.randn(2, 3))) is None  # one varying tensor is enough
    assert revive_degenerate_weights(model) == ["1.weight"]
    assert constant_output(model(images)) is None


def test_batchnorm_statistics_of_a_detector_are_set_without_training_mode_elsewhere():
    """torchvision's detectors want targets in training mode: the SSDLite and DeepLab MobileNetV3 builds set their
    BatchNorm statistics with only the BatchNorms in training mode."""
    import zoo_factories
    from torch import nn

    class Detector(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            if self.training:
                raise ValueError("In training mode, targets should be passed")
            return self.norm(self.conv(x) * 1e-2)

    model = Detector()
    zoo_factories.set_batchnorm_statistics(model, size=16, norms_only=True)
    assert not model.training and not model.norm.training
    assert float(model.norm.running_var.max()) < 1e-2  # statistics of the shrunk activations, not the initial 1


def test_a_timm_model_with_a_zero_head_is_given_as_a_trained_model_with_its_weights_file(tmp_path):
    """timm zero-initialises MLP-Mixer's head: the sweep hands it over as timm:NAME@weights.safetensors with the
    head revived, and a model timm builds without such weights by name alone."""
    pytest = __import__("pytest")
    pytest.importorskip("timm")
    from safetensors.torch import load_file
    from zoo_checks import build_source

    entries = {entry.name: entry for entry in zoo_sweep.zoo_catalog.all_entries()}
    row = {}
    spec = build_source(entries["timm/mixer_s16_224"], tmp_path, tmp_path, row)
    assert row["revived_weights"] == 1 and spec.kind == "timm" and spec.target == "mixer_s16_224"
    assert float(load_file(spec.weights)["head.weight"].abs().max()) > 0
    row = {}
    spec = build_source(entries["timm/resnet18"], tmp_path / "other", tmp_path, row)
    assert row["revived_weights"] == 0 and spec.weights is None
