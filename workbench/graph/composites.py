"""torch functions written in Python that hide layers' GEMMs and attention products from the run-time route.

``F.multi_head_attention_forward`` (Hugging Face WavLM's attention calls it with its ``q_proj``, ``k_proj``,
``v_proj`` and ``out_proj`` weights) computes four weight GEMMs and both attention products inside one call.
torch.fx keeps it as one node, and a ``torch.overrides.TorchFunctionMode`` sees only the outer call: torch
takes the mode off its stack while the mode handles a call, so the ``linear``, ``baddbmm`` and ``bmm`` inside
run unseen. The layers then never run as layers (their quantizers are never reached) and the products stay
in float.

:func:`expanded` gives the run-time recorder (:mod:`workbench.graph.runtime_ops`) and the run-time quantizers
(:mod:`workbench.graph.runtime_quant`) torch's own Python body of such a function with only its
torch-function dispatch check turned off, so that, run with the mode on, every call inside is seen: the
weights are quantized where they are used and the products get their quantizers, by the same rules as
anywhere else. It computes bit for bit what torch's function does (the same code). Its code carries a file
name of its own, so the call sites inside it (which key the run-time plan) are distinct from one another.
"""
from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable

import torch.nn.functional as F

__all__ = ["COMPOSITE_FUNCTIONS", "expanded", "composite_reason", "hides_calls", "leaf_reason"]

COMPOSITE_FUNCTIONS: tuple[Callable, ...] = (F.multi_head_attention_forward,)


def _no_torch_function(*args, **kwargs) -> bool:
    return False


@functools.cache
def _expand(func: Callable) -> Callable:
    namespace = dict(func.__globals__)
    namespace["has_torch_function"] = _no_torch_function  # the entry check only: the calls inside still dispatch
    code = func.__code__.replace(co_filename=f"<{func.__module__}.{func.__name__}, expanded by workbench>")
    body = types.FunctionType(code, namespace, func.__name__, func.__defaults__, func.__closure__)
    body.__kwdefaults__ = dict(func.__kwdefaults__ or {})
    body.__doc__ = func.__doc__
    return body


def expanded(func: Callable) -> Callable | None:
    """torch's Python body of ``func`` with its calls visible to a torch-function mode, or None when ``func`` is
    not one of :data:`COMPOSITE_FUNCTIONS`."""
    if not any(func is f for f in COMPOSITE_FUNCTIONS):
        return None
    return _expand(func)


def composite_reason(func: Callable) -> str:
    """Why a forward calling ``func`` goes to the run-time route rather than torch.fx's."""
    return (f"calls {func.__module__}.{func.__name__}, which torch.fx keeps as one call: the weight GEMMs and "
            "attention products inside it are found by running the model")


# modules whose Python functions fx records as call_function nodes without hiding anything: torch's own ops and
# functionals (the run-time route sees them the same way) and Python's operators
_OPEN_MODULES = ("torch", "_operator", "operator", "builtins", "math")


def hides_calls(func: object) -> bool:
    """Whether a call_function target of a traced graph hides the torch calls it makes: one of
    :data:`COMPOSITE_FUNCTIONS`, or a Python function of a library or model that ``torch.fx.wrap`` keeps whole
    (torchvision's Swin computes its qkv and projection GEMMs and both attention products inside
    ``shifted_window_attention``: traced, the module shows one call and its products stay float). The run-time
    route runs such a function's body with every call inside it seen."""
    if any(func is f for f in COMPOSITE_FUNCTIONS):
        return True
    module = getattr(func, "__module__", None) or ""
    return inspect.isfunction(func) and module.split(".")[0] not in _OPEN_MODULES and _computes_products(func)


# what a function's code names when it computes a GEMM or a product (timm's fx-wrapped mask helpers name none:
# their modules keep torch.fx's route)
_PRODUCTS = frozenset({"matmul", "bmm", "baddbmm", "einsum", "linear", "scaled_dot_product_attention", "conv1d",
                       "conv2d", "conv3d", "multi_head_attention_forward"})


@functools.cache
def _computes_products(func: Callable) -> bool:
    """Whether ``func``'s own code calls a GEMM or product by name, or multiplies matrices with ``@``."""
    import dis

    code = func.__code__
    if _PRODUCTS & set(code.co_names):
        return True
    return any(i.opname == "BINARY_OP" and i.argrepr in ("@", "@=") for i in dis.get_instructions(code))


def leaf_reason(func: object) -> str:
    """Why a forward calling ``func`` (see :func:`hides_calls`) goes to the run-time route."""
    if any(func is f for f in COMPOSITE_FUNCTIONS):
        return composite_reason(func)  # type: ignore[arg-type]
    return (f"calls {getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}, which torch.fx keeps "
            "as one call (torch.fx.wrap): the weight GEMMs and attention products inside it are found by running "
            "the model")
