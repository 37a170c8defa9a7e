"""Round 2, item 5: a calibration that reaches no quantizer changes nothing and exits non-zero (it warned
"left unchanged", exited 0, and every layer ended up uncalibrated)."""
import textwrap

import numpy as np
import pytest
import torch
from cli_helpers import run, write_data
from torch import nn

from workbench.project import load_project
from workbench.quant import replace_to_quantization_module
from workbench.quant.algorithms.calibrate import NothingReachedError, calibrate

BRANCHY = textwrap.dedent("""
    import torch
    from torch import nn

    class Branchy(nn.Module):
        '''Skips its layers on an all-zero input (a model with a fast path the quantizers never see).'''
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            if not bool(x.any()):
                return x.new_zeros(x.shape[0], 2)
            return self.fc(torch.relu(self.conv(x)).mean((2, 3)))

    def make():
        torch.manual_seed(0)
        return Branchy()
""")


def test_the_cli_exits_2_and_keeps_the_good_calibration(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "branchy.py").write_text(BRANCHY)
    data = write_data(tmp_path)
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"{tmp_path}/branchy.py:make", "--data", data,
                       "--batch-size", "4", "--trust-code")
    assert code == 0, err
    code, out, err = run(capsys, "calibrate", project, "--method", "max")
    assert code == 0, err
    before = project.read_bytes()
    amax = {n: r.amax.copy() for n, r in load_project(project).current_calibration.quantizers.items()}
    assert len(amax) == 4

    write_data(tmp_path, fill=0.0)  # the same file, now data on which the model skips its layers
    code, out, err = run(capsys, "calibrate", project, "--method", "max")
    assert code == 2, (code, err)
    assert "Calibration reached no quantizer" in err and "ran on 2 batches" in err and "conv._input_quantizer" in err
    assert "Traceback" not in err and out == ""
    assert project.read_bytes() == before
    stored = load_project(project)
    assert len(stored.calibrations) == 1
    assert all(np.array_equal(stored.current_calibration.quantizers[n].amax, a) for n, a in amax.items())


def test_the_core_restores_the_model_when_nothing_is_reached():
    class Skips(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return x[:, :2]

    model = Skips().eval()
    replace_to_quantization_module(model)
    model.fc._input_quantizer.amax = torch.tensor(3.0)
    with pytest.raises(NothingReachedError) as caught:
        calibrate(model, [torch.randn(2, 4)], num_batches=1, method="max", report_sqnr=False)
    assert caught.value.names == ["fc._input_quantizer", "fc._weight_quantizer"] and caught.value.batches == 1
    assert float(model.fc._input_quantizer.amax) == 3.0 and not model.fc._input_quantizer._if_calib
