"""A descriptor edited back to its default is no override: the layer reads, saves and digests as untouched
(issue 27). The default compared against is the layer's own (its quantized class and the project's defaults)."""
from workbench.session import Session
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


def demo_session():
    return Session.create(ModelSpec("demo", "digits"),
                          DataSpec("demo", "digits", split="train", batch_size=64, num_batches=1))


def test_an_edit_undone_by_hand_leaves_no_override(tmp_path):
    session = demo_session()
    untouched = session.state_digest()
    layer = session.project.layers["block.conv1"]

    assert session.set_descriptor(["block.conv1"], "input", num_bits=6) == ["block.conv1"]
    assert layer.input_desc == {"num_bits": 6, "calib_method": "histogram"}
    assert session.state_digest() != untouched
    # back to 8 bits by hand: the same quantizer as the default, so no override and the same state
    assert session.set_descriptor(["block.conv1"], "input", num_bits=8) == ["block.conv1"]
    assert layer.input_desc is None and session.state_digest() == untouched
    assert session.quantized_model().block.conv1.input_quantizer.num_bits == 8

    # the weight's default is per-channel on axis 0 (the class's own): per-tensor and back again
    session.set_descriptor(["block.conv1"], "weight", axis=None)
    assert layer.weight_desc is not None
    session.set_descriptor(["block.conv1"], "weight", axis=0)
    assert layer.weight_desc is None and session.state_digest() == untouched

    # "setting" a field to the value it has is no change at all
    assert session.set_descriptor(["block.conv2"], "input", num_bits=8, calib_method="histogram") == []
    assert session.project.layers["block.conv2"].input_desc is None

    # saved and reopened: still no override
    path = tmp_path / "p.qwb"
    session.save(path)
    assert Session.open(path).project.layers["block.conv1"].input_desc is None


def test_a_layer_in_another_precision_keeps_that_precision_when_edited_back():
    session = demo_session()
    session.set_precision(["fc"], "fp8")
    fp8 = dict(session.project.layers["fc"].input_desc)
    session.set_descriptor(["fc"], "input", calib_method="histogram")
    session.set_descriptor(["fc"], "input", calib_method="max")
    # compared with its own default, not the int8 one: the fp8 descriptor stays, unchanged
    assert session.project.layers["fc"].input_desc == fp8
    assert session.precisions(["fc"])["fc"].value == "fp8"
