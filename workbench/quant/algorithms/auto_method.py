"""The "auto" amax method: per histogram quantizer, the method whose layer output is closest to FP32.

Every single method (entropy, mse, percentile, max) proposes an amax from the quantizer's histogram; each
candidate is then measured where it matters, on the calibration batches: the module that owns the
quantizer (the conv or linear whose input it quantizes, the quantized add or matmul) runs once per
candidate with only that quantizer on, and its output is compared with the module's FP32 output. The
candidate with the highest output SQNR wins. A half-zeros (padded) input where entropy clips 90% of the
range, a heavy tail that max lets through, a ReLU output: each gets the method that hurts its layer least,
with the numbers that made the choice kept as its reason.

A quantizer owned by the model itself (a rewrite that put it on the root) is measured on the quantized
tensor instead (its own SQNR), since running the whole model once per candidate per quantizer would cost
more than the calibration.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.quant.algorithms.batches import flat_tensors, run_model
from workbench.quant.algorithms.distributed import SINGLE, DistContext
from workbench.quant.calib.methods import AmaxMethod
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["MethodChoice", "choose_methods", "CRITERIA"]

# what a choice was measured on, in words (the JSON's "criterion" values)
CRITERIA = {"layer output": "the output of the module that owns the quantizer, vs its FP32 output",
            "tensor": "the quantized tensor itself, vs the FP32 tensor (a quantizer owned by the model's root)"}

# candidates within this share of a dB of the best count as ties (then the earlier method in AmaxMethod wins)
_TIE_DB = 1e-6


@dataclass
class MethodChoice:
    """Which method a quantizer got from "auto", and why.

    Attributes:
        method: the single method picked (entropy, mse, percentile or max).
        amax: each candidate method's amax (None where a method was not available: too few values).
        sqnr_db: each measured candidate's output SQNR in dB (higher is better).
        criterion: what was measured (a key of :data:`CRITERIA`).
        batches: how many calibration batches the measurement covered.
    """

    method: str
    amax: dict[str, float | None]
    sqnr_db: dict[str, float]
    criterion: str
    batches: int
    owner: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def reason(self) -> str:
        """One line: the pick, its number and the others' (``mse: layer output SQNR 38.2 dB (entropy 12.1, ...)``)."""
        others = ", ".join(f"{m} {_db(v)}" for m, v in self.sqnr_db.items() if m != self.method)
        where = f"{self.owner}'s output" if self.criterion == "layer output" and self.owner else "the tensor"
        text = (f"{self.method}: SQNR of {where} {_db(self.sqnr_db.get(self.method))} dB over {self.batches} "
                f"batch{'es' if self.batches != 1 else ''}")
        same = [m for m, v in self.amax.items() if m != self.method and v is not None
                and v == self.amax.get(self.method)]
        if others:
            text += f" (vs {others} dB)"
        if same:
            text += f"; same amax as {', '.join(same)}"
        return text + "".join(f"; {note}" for note in self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "reason": self.reason, "amax": dict(self.amax),
                "sqnr_db": {m: _finite_or_text(v) for m, v in self.sqnr_db.items()}, "criterion": self.criterion,
                "batches": self.batches, "owner": self.owner, "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MethodChoice:
        """A choice as :meth:`to_dict` wrote it; ValueError when a field is missing or of the wrong kind."""
        try:
            method = AmaxMethod.parse(data["method"]).value
            amax = {str(m): None if v is None else float(v) for m, v in dict(data["amax"]).items()}
            sqnr = {str(m): float(v) for m, v in dict(data["sqnr_db"]).items()}
            return cls(method, amax, sqnr, str(data["criterion"]), int(data["batches"]), str(data.get("owner", "")),
                       [str(n) for n in data.get("notes", [])])
        except (KeyError, TypeError) as error:
            raise ValueError(f"not a method choice ({type(error).__name__}: {error})") from None


def _db(value: float | None) -> str:
    if value is None:
        return "?"
    return "inf" if value == math.inf else f"{value:.1f}"


def _finite_or_text(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def _sqnr(signal: float, noise: float) -> float:
    if noise <= 0:
        return math.inf
    if signal <= 0:
        return -math.inf
    return 10 * math.log10(signal / noise)


def _owners(model: nn.Module, quantizers: dict[str, TensorQuantizer]) -> dict[int, list[tuple[str, nn.Module]]]:
    """For each quantizer (by id), the modules that hold it as a direct child, with their names."""
    wanted = {id(q) for q in quantizers.values()}
    owners: dict[int, list[tuple[str, nn.Module]]] = {}
    for module_name, module in model.named_modules():
        for child in module.children():
            if id(child) in wanted:
                owners.setdefault(id(child), []).append((module_name, module))
    return owners


class _Accumulator:
    """Signal and noise power per candidate method of one quantizer, summed over batches and owners."""

    def __init__(self, candidates: dict[str, float]) -> None:
        self.candidates = candidates
        self.signal = 0.0
        self.noise = dict.fromkeys(candidates, 0.0)

    def add(self, reference: Any, method: str, test: Any) -> None:
        ref, out = flat_tensors(reference), flat_tensors(test)
        if len(ref) != len(out):
            return
        noise = 0.0
        for r, t in zip(ref, out):
            if r.is_floating_point() and r.shape == t.shape:
                # NaN/Inf elements are left out, as the calibrators leave them out: one bad batch must not
                # turn every candidate's SQNR into NaN
                diff = (r.double() - t.double()).pow(2)
                noise += float(diff[torch.isfinite(diff)].sum())
        self.noise[method] += noise

    def add_signal(self, reference: Any) -> None:
        for r in flat_tensors(reference):
            if r.is_floating_point():
                power = r.double().pow(2)
                self.signal += float(power[torch.isfinite(power)].sum())


def choose_methods(model: nn.Module, quantizers: dict[str, TensorQuantizer], candidates: dict[str, dict[str, float]],
                   batches: Iterable, device: torch.device, *, context: DistContext | None = None,
                   cancel: Callable[[], bool] | None = None) -> dict[str, MethodChoice]:
    """Pick each quantizer's method among ``candidates`` (name -> {method: amax}) by its owner's output SQNR.

    The model runs in FP32 (every quantizer off) on ``batches``; for each owner module of a quantizer in
    ``candidates``, a forward hook reruns the module once per distinct candidate amax with only that
    quantizer on, and sums the output's squared error against the FP32 output. Every quantizer's flags and
    amax are as before when this returns (or raises). In a distributed job each rank measures its batches
    and the sums are added across ranks, so every rank picks the same.
    """
    context = context or SINGLE
    by_id = {id(quantizers[name]): name for name in candidates}
    owners = _owners(model, {name: quantizers[name] for name in candidates})
    accumulators = {name: _Accumulator(values) for name, values in candidates.items()}
    owner_names: dict[str, str] = {}
    # amax is written in place by the setter: keep copies
    states = {name: (q._disabled, q._if_quant, q._if_calib, None if getattr(q, "_amax", None) is None
                     else q._amax.detach().clone()) for name, q in quantizers.items()}
    busy = [False]  # a module rerun inside a hook calls its children: their hooks stay quiet then

    def measure(name: str, quantizer: TensorQuantizer, rerun: Callable[[], Any], reference: Any) -> None:
        accumulator = accumulators[name]
        accumulator.add_signal(reference)
        results: dict[float, Any] = {}
        quantizer._disabled, quantizer._if_quant, quantizer._if_calib = False, True, False
        try:
            for method, amax in accumulator.candidates.items():
                if amax not in results:  # two methods with one amax: one run
                    quantizer.amax = torch.tensor(amax, dtype=torch.float32)
                    results[amax] = rerun()
                accumulator.add(reference, method, results[amax])
        finally:
            quantizer._disabled = True

    def owner_hook(module_name: str, owned: list[tuple[str, TensorQuantizer]]):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if busy[0]:
                return
            busy[0] = True
            try:
                for name, quantizer in owned:
                    owner_names.setdefault(name, module_name)
                    measure(name, quantizer, lambda: module(*args, **kwargs), output)
            finally:
                busy[0] = False
        return hook

    def tensor_hook(name: str):
        def hook(quantizer: TensorQuantizer, args: tuple, output: Any) -> None:
            if busy[0] or not args or not isinstance(args[0], torch.Tensor):
                return
            busy[0] = True
            try:
                measure(name, quantizer, lambda: quantizer(args[0]), args[0])
            finally:
                busy[0] = False
        return hook

    handles = []
    by_owner: dict[int, tuple[str, nn.Module, list[tuple[str, TensorQuantizer]]]] = {}
    for qid, name in by_id.items():
        quantizer = quantizers[name]
        usable = [(owner_name, owner) for owner_name, owner in owners.get(qid, []) if owner is not model]
        if not usable:  # on the root (or nowhere): measure the tensor itself
            handles.append(quantizer.register_forward_hook(tensor_hook(name)))
            owner_names[name] = ""
            continue
        for owner_name, owner in usable:
            by_owner.setdefault(id(owner), (owner_name, owner, []))[2].append((name, quantizer))
    for owner_name, owner, owned in by_owner.values():
        handles.append(owner.register_forward_hook(owner_hook(owner_name, owned), with_kwargs=True))

    done = 0
    try:
        for q in quantizers.values():
            q._disabled = True
        with torch.no_grad():
            for batch in batches:
                if cancel is not None and cancel():
                    break
                run_model(model, batch, device)
                done += 1
    finally:
        for handle in handles:
            handle.remove()
        for name, q in quantizers.items():
            disabled, if_quant, if_calib, amax = states[name]
            q._disabled, q._if_quant, q._if_calib = disabled, if_quant, if_calib
            if amax is None:
                q.reset_amax()
            else:
                q._buffers["_amax"] = amax
    if context.distributed:
        sums = context.all_gather({name: (acc.signal, acc.noise) for name, acc in accumulators.items()})
        done = sum(context.all_gather(done))
        for name, acc in accumulators.items():
            acc.signal = sum(part[name][0] for part in sums)
            acc.noise = {m: sum(part[name][1][m] for part in sums) for m in acc.noise}
    choices = {}
    for name, acc in accumulators.items():
        sqnr = {method: _sqnr(acc.signal, noise) for method, noise in acc.noise.items()}
        best = max(sqnr.values())
        # the first method (in AmaxMethod's order) within a hair of the best
        method = next(m for m in acc.candidates if sqnr[m] >= best - _TIE_DB or sqnr[m] == best)
        owner = owner_names.get(name, "")
        notes = [] if acc.signal > 0 else ["its layer output was all zeros on these batches"]
        full = {m.value: candidates[name].get(m.value) for m in AmaxMethod.singles()}
        choices[name] = MethodChoice(method, full, sqnr, "layer output" if owner else "tensor", done, owner, notes)
    return choices
