"""Quantized modules, one file per family, as in pytorch-quantization."""
