"""How every tab spells numbers, sizes, durations and shapes (workbench.app.formatting)."""
import math

from workbench.app.formatting import format_delta, format_number, format_seconds, format_shape, format_size


def test_numbers():
    assert format_number(math.inf) == "∞" and format_number(-math.inf) == "−∞" and format_number(None) == "n/a"
    assert format_number(35.452306) == "35.45" and format_number(0.000123456, 3) == "0.000123"
    assert format_number(0.98765432, spec=".6f") == "0.987654" and format_number("not a number") == "n/a"
    # the fine-tune history marks an epoch that measured nothing with a dash
    assert format_number(float("nan"), missing="-") == "-" and format_number(0.012345, missing="-") == "0.01235"


def test_deltas_carry_their_sign():
    assert format_delta(0.5642) == "+0.564" and format_delta(-0.00366) == "−0.00366" and format_delta(0.0) == "0"
    assert format_delta(math.inf) == "∞" and format_delta(None) == "n/a"


def test_sizes_durations_and_shapes():
    assert format_size(512) == "512 bytes" and format_size(48923) == "47.8 KiB" and format_size(3 << 20) == "3.0 MiB"
    assert format_size(None) == "n/a"
    assert format_seconds(4.24) == "4.2 s" and format_seconds(42.4) == "42 s" and format_seconds(187) == "3 min 07 s"
    assert format_seconds(3900) == "1 h 05 min" and format_seconds(-1) == "0.0 s"
    assert format_shape((1, 3, 224, 224)) == "1×3×224×224" and format_shape(None) == "?"


def test_elide_name_keeps_the_end_and_the_block_index():
    from workbench.app.formatting import elide_name

    name = "bert.encoder.layer.10.attention.self.query"
    assert elide_name(name, lambda text: len(text) <= 60) == name
    assert elide_name(name, lambda text: len(text) <= 32) == "…layer.10.attention.self.query"
    assert elide_name(name, lambda text: len(text) <= 20) == "…10.….self.query"
    assert elide_name(name, lambda text: len(text) <= 3) == "…query"
    # three different layers stay three different labels (middle elision made them one)
    names = [f"bert.encoder.layer.{i}.attention.self.query" for i in (0, 1, 2)]
    assert len({elide_name(n, lambda text: len(text) <= 20) for n in names}) == 3
