"""Algorithms over whole models: what walks a model's quantizers rather than one tensor.

The calibration workflow (``calibrate``, ``auto_method``, ``blocks``, ``batches``), SmoothQuant and AWQ
(``smoothing``), precisions and their format and TensorRT rules (``precision``, ``format_rules``,
``tensorrt_rules``), quantizer snapshots (``snapshot``) and the distributed merge of calibrators across ranks
(``distributed``). They build on the compatible vocabulary one level up (``workbench.quant.tensor_quant``,
``.nn``, ``.calib``) and never on anything above ``workbench.quant``.
"""
