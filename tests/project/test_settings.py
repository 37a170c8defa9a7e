"""The project's settings checks, below the session: the error they raise is the project layer's own."""
import pytest

from workbench.project.settings import DEFAULT_SETTINGS, SettingsError, checked_setting, jsonable, make_descriptor


def test_every_default_passes_its_own_check():
    for key, value in DEFAULT_SETTINGS.items():
        assert checked_setting(key, value) == value


@pytest.mark.parametrize("key, value, message", [
    ("calibration", {"method": "entropy", "percentile": 0}, "percentile is a number in (0, 100]"),
    ("metric", {"name": "", "direction": None}, "needs a name"),
    ("pins", "conv1", "pairs of quantizer or layer names"),
    ("colour", "blue", "Unknown setting 'colour'"),
])
def test_a_bad_value_raises_settings_error_naming_it(key, value, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        checked_setting(key, value)


def test_checked_value_is_a_copy_and_pins_become_lists():
    value = {"add": True, "concat": False}
    checked = checked_setting("functional", value)
    checked["add"] = False
    assert value["add"] is True
    assert checked_setting("pins", (("a", "b"),)) == [["a", "b"]]


def test_stored_descriptor_fields_make_the_descriptor():
    descriptor = make_descriptor({"num_bits": 8, "axis": [0], "calib_method": "histogram"})
    assert descriptor.axis == 0 and descriptor.calib_method == "histogram"
    assert make_descriptor(None) is None
    assert jsonable({"axis": (1, 2), "x": float("inf")}) == {"axis": [1, 2], "x": "inf"}
