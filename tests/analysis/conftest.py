"""Fixtures of the analysis tests; the models themselves are in analysis_models.py."""
from __future__ import annotations

import pytest
import torch
from analysis_models import ResidualNet, make_batches, quantized, sensitive_net
from torch import nn


@pytest.fixture
def batches() -> list[torch.Tensor]:
    return make_batches()


@pytest.fixture
def sensitive_model(batches) -> nn.Sequential:
    return quantized(sensitive_net(), batches)


@pytest.fixture
def residual_model(batches) -> ResidualNet:
    torch.manual_seed(0)
    return quantized(ResidualNet(), batches)
