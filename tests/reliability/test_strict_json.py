"""Item 3: output that says it is JSON is strict JSON."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.strict_json import dumps, strict


def strict_loads(text):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_become_text():
    data = {"sqnr": math.inf, "loss": float("nan"), "low": -math.inf, "ok": 1.5,
            "amax": np.array([1.0, np.nan], dtype=np.float32), "t": torch.tensor([math.inf, 2.0]),
            "scalar": np.float32("nan"), "count": np.int64(3), "flag": np.bool_(True), "path": Path("a/b"),
            (1, 2): (3, {4})}
    text = dumps(data)
    loaded = strict_loads(text)
    assert loaded["sqnr"] == "inf" and loaded["loss"] == "nan" and loaded["low"] == "-inf" and loaded["ok"] == 1.5
    assert loaded["amax"] == [1.0, "nan"] and loaded["t"] == ["inf", 2.0] and loaded["scalar"] == "nan"
    assert loaded["count"] == 3 and loaded["flag"] is True and loaded["path"] == "a/b"
    assert loaded["(1, 2)"] == [3, [4]]


def test_plain_json_dumps_is_what_broke():
    with pytest.raises(ValueError):
        strict_loads(json.dumps({"x": float("nan")}))


def test_strict_passes_plain_data_through():
    data = {"a": [1, 2.5, "x", None, True], "b": {"c": []}}
    assert strict(data) == data and strict_loads(dumps(data)) == data
