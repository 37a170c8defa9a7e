"""torch.compile for the small elementwise CUDA kernels (fake quantization, STE backward), made safe to use.

Three things the first GPU run (H200, torch 2.11) showed, and what this module does about each:

* **Inexact division.** Inductor emits ``x / y`` for Triton, which lowers to the approximate
  ``div.full.f32`` (up to 2 ulp off), so ``round(x / step)`` flips near .5 boundaries and ``q / scale``
  differs in the last bit from every other path. :func:`precise_options` asks Inductor for IEEE
  round-to-nearest division (``div_rn``), under whichever name the running torch knows it.
* **Recompile limit.** Dynamo keeps one cache per *code object*, limited to 8 entries; dtypes, bounds
  and sizes of 1 (which dynamic shapes still specialise) together went past it and, with
  ``fullgraph=True``, raised ``FailOnRecompileLimitHit`` into training. Each :class:`ElementwiseKernel`
  compiles its own copy of the code object, so each (formula, dtype, bounds, layout) has its own small
  cache (a few shape variants), and a kernel that still reaches the limit gets a higher one
  (:data:`RECOMPILE_LIMIT`) for itself only.
* **Errors reaching users.** Any exception from compiling or running the kernel is caught here: the
  kernel is switched off for the rest of the process, logged once, and the caller runs its torch
  reference (which computes the same bits).
"""
from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)


# graphs one kernel may hold: dynamo's default limit (8) is raised to this for our kernels only, on demand
RECOMPILE_LIMIT = 32


def device_key(device: torch.device | str) -> str:
    """One spelling per device for the verification caches: ``"cuda"`` and ``"cuda:0"`` name the same GPU
    when 0 is the current one (the diag asked with ``"cuda"`` while tensors report ``"cuda:0"``, so every
    status read "not tried yet")."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        try:
            return f"cuda:{torch.cuda.current_device()}"
        except Exception:  # noqa: BLE001 - no CUDA here: the plain name is as good as any
            return "cuda"
    return str(device)


def _is_recompile_limit(error: BaseException) -> bool:
    return "recompilelimit" in type(error).__name__.lower() or "recompile limit" in str(error).lower()


def precise_options() -> dict[str, Any]:
    """Inductor options that make float32 division correctly rounded, for the running torch version
    (empty when it has no such switch; the kernels' bit-for-bit verification then decides)."""
    try:
        import torch._inductor.config as inductor_config
    except Exception:  # noqa: BLE001 - no Inductor at all: torch.compile will fail and we fall back
        return {}
    nested = getattr(inductor_config, "eager_numerics", None)
    if nested is not None and hasattr(nested, "division_rounding"):  # torch >= 2.12
        return {"eager_numerics.division_rounding": True}
    if hasattr(inductor_config, "emulate_divison_rounding"):  # torch 2.10/2.11 (the name's typo is torch's)
        return {"emulate_divison_rounding": True}
    return {}


class ElementwiseKernel:
    """``fn`` compiled by torch.compile (dynamic shapes, one graph, exact division) with a dynamo cache of its
    own. Calling it returns the result, or None once compiling or running has failed (logged once)."""

    def __init__(self, fn: Callable[..., torch.Tensor], tag: str) -> None:
        name = f"{fn.__name__}__{tag}"
        # a new code object: dynamo's cache and its recompile limit are per code object
        code = fn.__code__.replace(co_name=name)
        self.function = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        self.name = name
        self.error: str | None = None
        self._compiled: Any = None
        self._raised_limit_calls = 0
        self._lock = threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._compiled is None:
                self._compiled = torch.compile(self.function, dynamic=True, fullgraph=True,
                                               options=precise_options())
        return self._compiled

    def __call__(self, *args: Any) -> torch.Tensor | None:
        if self.error is not None:
            return None
        try:
            return self._get()(*args)
        except Exception as error:  # noqa: BLE001 - any compiler failure: the caller's reference takes over
            if _is_recompile_limit(error) and self._raised_limit_calls < RECOMPILE_LIMIT:
                # a model with many distinct shapes (sizes of 1, equal sizes that dynamo's duck shaping ties
                # together): compile this one too, under a higher limit for this kernel only. The limit is
                # checked only on a cache miss, so calls that hit a compiled graph never pay for the patch.
                self._raised_limit_calls += 1
                try:
                    import torch._dynamo

                    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                        return self._compiled(*args)
                except Exception as retry_error:  # noqa: BLE001
                    error = retry_error
            self.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
            logger.warning("compiled kernel %s failed (%s); using torch operations from now on", self.name,
                           self.error)
            return None

    def cache_entries(self) -> int | None:
        """How many graphs dynamo holds for this kernel (1 + recompiles), or None if torch cannot say."""
        try:
            from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
            return len(_debug_get_cache_entry_list(self.function.__code__))
        except Exception:  # noqa: BLE001 - a diagnostic only
            return None
