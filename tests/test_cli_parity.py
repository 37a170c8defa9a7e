"""The CLI's parity threshold and strictness (issue 34 point 3, issue 37): a file that fails parity is written "not
validated" with its diagnosis (exit 4) unless --strict, the threshold is a project setting, the history records it."""
import json
import textwrap

import torch
from cli_run import run

from workbench.project import load_project

MODEL = textwrap.dedent('''
    import torch
    from torch import nn


    class Normalize(nn.Module):
        def forward(self, x):
            return x / float(x.abs().amax())  # read into Python: the tracer keeps the sample's value


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.act = nn.ReLU()
            self.norm = Normalize()
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.conv2(self.norm(self.act(self.conv1(x)))).mean((2, 3)))


    def build():
        torch.manual_seed(0)
        return Net().eval()
''')


def test_export_writes_a_file_that_fails_parity_not_validated_and_strict_refuses_it(tmp_path, capsys):
    (tmp_path / "net.py").write_text(MODEL)
    torch.save(torch.randn(8, 3, 8, 8, generator=torch.Generator().manual_seed(0)), tmp_path / "x.pt")
    project = tmp_path / "p.qwb"
    code, _, err = run(capsys, "new", project, "--model", f"{tmp_path / 'net.py'}:build", "--data", tmp_path / "x.pt",
                       "--batch-size", "4", "--trust-code")
    assert code == 0, err
    assert run(capsys, "calibrate", project)[0] == 0

    code, out, err = run(capsys, "export", project, "-o", tmp_path / "strict.onnx", "--strict")
    assert code != 0 and "module 'norm'" in err and "strict" in err
    assert not (tmp_path / "strict.onnx").exists()

    code, out, err = run(capsys, "export", project, "-o", tmp_path / "m.onnx", "--json")
    assert code == 4, err
    report = json.loads(out)
    assert report["validated"] is False and report["parity_diagnosis"]["module"] == "norm"
    assert (tmp_path / "m.onnx").is_file()
    record = load_project(project).exports[-1]
    assert record.settings["validated"] is False and record.report["parity_diagnosis"]["verdict"] == "operation"

    code, out, _ = run(capsys, "set", project, "--export", "min_cosine=-1")
    assert code == 0 and "min_cosine=-1" in out
    code, out, err = run(capsys, "export", project, "-o", tmp_path / "m.onnx")
    assert code == 0, err
    assert "NOT VALIDATED" not in out
    assert load_project(project).exports[-1].settings["validated"] is True

    code, _, err = run(capsys, "set", project, "--export", "min_cosine=2")
    assert code != 0 and "export.min_cosine" in err
