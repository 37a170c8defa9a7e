"""Quant Workbench: INT8 post-training quantization of PyTorch models for TensorRT."""

__version__ = "0.1.0"
