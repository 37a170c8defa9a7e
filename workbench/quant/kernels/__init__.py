"""The kernels: how a fake quantization, its straight-through gradient, a histogram or an abs max is computed.

``fake_quant`` dispatches each call to the fastest exact implementation at hand (the C extension built from
``csrc/`` on CPU, a Triton or ``torch.compile`` kernel on CUDA, torch operations everywhere else), ``ste`` does
the same for the backward pass; every path computes bit-identical numbers. Nothing here knows about modules,
models or descriptors: the vocabulary one level up (``workbench.quant.tensor_quant``, ``.nn``, ``.calib``)
calls into it.
"""
