"""Helpers for quantization-aware training (``pytorch_quantization.optim``)."""
