"""One vocabulary of amax methods and one percentile range, read by the core, the settings and the CLI."""
import pytest
import torch

from workbench import cli
from workbench.project.settings import SettingsError, checked_setting
from workbench.quant.calib import (
    AMAX_METHODS,
    PERCENTILE,
    PERCENTILE_FLOOR,
    AmaxMethod,
    HistogramCalibrator,
    UnknownMethodError,
)


def test_methods_and_their_parameters():
    assert AMAX_METHODS == ("entropy", "mse", "percentile", "max", "auto")
    assert [m.value for m in AmaxMethod.singles()] == ["entropy", "mse", "percentile", "max"]
    assert AmaxMethod.parse("mse") is AmaxMethod.MSE and AmaxMethod.PERCENTILE.parameters == (PERCENTILE,)
    assert AmaxMethod.MAX.parameters == ()
    with pytest.raises(UnknownMethodError, match="choose one of entropy, mse, percentile, max, auto"):
        AmaxMethod.parse("kl")


@pytest.mark.parametrize("value, ok", [(0, False), (1e-6, True), (99.99, True), (100, True), (100.5, False),
                                       (True, False), ("99", False), (float("nan"), False)])
def test_one_percentile_range_everywhere(value, ok):
    """The core, the settings and the calibrator all take (0, 100]: they agree on every value."""
    calibrator = HistogramCalibrator(8, None, False)
    calibrator.collect(torch.randn(5000))
    if ok:
        assert PERCENTILE.check(value) == float(value)
        assert float(calibrator.compute_amax("percentile", percentile=value)) >= 0
        if value >= PERCENTILE_FLOOR:
            assert checked_setting("calibration", {"percentile": value})["percentile"] == value
        else:  # valid, but the project refuses what is almost certainly a fraction typed for a percent
            with pytest.raises(SettingsError, match="did you mean"):
                checked_setting("calibration", {"percentile": value})
        return
    with pytest.raises(ValueError, match=r"\(0, 100\]"):
        PERCENTILE.check(value)
    with pytest.raises(SettingsError, match=r"\(0, 100\]"):
        checked_setting("calibration", {"percentile": value})
    with pytest.raises(ValueError, match=r"\(0, 100\]"):
        calibrator.compute_amax("percentile", percentile=value)


def test_the_command_line_lists_the_vocabulary():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    method = next(a for a in subparsers["calibrate"]._actions if a.dest == "method")
    assert tuple(method.choices) == AMAX_METHODS
    assert all(m.description in method.help for m in AmaxMethod)
    percentile = next(a for a in subparsers["calibrate"]._actions if a.dest == "percentile")
    assert PERCENTILE.describe() in percentile.help
