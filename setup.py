"""Builds the optional CPU kernels (fake quantization, histogram amax searches).

Everything else lives in pyproject.toml. The extension is plain C (no torch headers), so building
it needs only a C compiler, not torch; when the build fails the package still installs and falls
back to a slower pure-torch implementation with identical numbers.
"""
import sys

from setuptools import Extension, setup

if sys.platform == "win32":
    compile_args = ["/O2", "/fp:precise"]
    link_args: list[str] = []
else:
    # No -ffast-math: it would turn x / step into x * (1 / step) and break NaN handling.
    compile_args = ["-O3", "-fno-math-errno", "-ffp-contract=off"]
    link_args = ["-pthread"]

setup(
    ext_modules=[
        Extension(
            "workbench.quant.kernels._cpu_kernels",
            sources=[f"workbench/quant/kernels/csrc/{name}.c"
                     for name in ("module", "parallel", "cpu", "fake_quant", "ste_grad", "amax_search", "histogram",
                                      "abs_max")],
            depends=[f"workbench/quant/kernels/csrc/{name}.h" for name in ("kernels", "half", "avx2_load")],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            optional=True,
        )
    ]
)
