"""Builds the optional CPU fake-quantization kernel.

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
            "workbench.quant._fake_quant_cpu",
            sources=["workbench/quant/csrc/fake_quant.c"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            optional=True,
        )
    ]
)
