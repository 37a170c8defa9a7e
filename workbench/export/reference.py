"""The fake-quant reference run of an export: sample inputs, which quantizers export, and the outputs
onnxruntime must match (with the failing layer named when the model does not take the inputs)."""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from workbench.export.errors import ExportError, QuantizerStateError, SampleInputError
from workbench.export.outputs import named_tensors, pick_outputs
from workbench.export.qdq import ExportParams, QDQStandIn, export_params
from workbench.quant.algorithms.batches import flat_tensors, select_output
from workbench.quant.algorithms.snapshot import all_quantizers, is_quantizing, quantizer_names
from workbench.quant.algorithms.tensorrt_rules import tensorrt_check
from workbench.quant.nn.modules.tensor_quantizer import TensorQuantizer

__all__ = ["sample_call", "ExportCall", "default_input_names", "grow_batch", "grow_sequence", "first_quantizer_names",
           "check_quantizers", "rounding", "stand_ins", "traced_module_scopes", "run_reference", "without_cache"]


# ----- inputs and outputs -----------------------------------------------------------------------


def sample_call(sample_inputs: Any) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """The sample inputs as ``(positional, keyword)`` tensors: a tensor, a tuple of tensors, or a dict of
    keyword inputs (``{"input_ids": ..., "attention_mask": ...}``)."""
    if isinstance(sample_inputs, torch.Tensor):
        return (sample_inputs,), {}
    if isinstance(sample_inputs, Mapping) and sample_inputs and all(
            isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in sample_inputs.items()):
        return (), dict(sample_inputs)
    if isinstance(sample_inputs, (tuple, list)) and sample_inputs and all(
            isinstance(t, torch.Tensor) for t in sample_inputs):
        return tuple(sample_inputs), {}
    raise TypeError("sample_inputs must be a tensor, a non-empty tuple of tensors (the model's positional inputs) "
                    f"or a dict of tensors by argument name, got {type(sample_inputs).__name__}.")


def default_input_names(model: nn.Module, args: tuple, kwargs: dict) -> list[str]:
    """ONNX input names after the forward's arguments (``input_ids``, ``attention_mask``); a generic
    ``x`` is called ``input``. Without a readable signature: ``input`` / ``input_N``."""
    fallback = ["input"] if len(args) == 1 else [f"input_{i}" for i in range(len(args))]
    try:
        parameters = [p for p in inspect.signature(model.forward).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        parameters = []
    if len(parameters) >= len(args):
        positional = ["input" if p.name == "x" else p.name for p in parameters[:len(args)]]
        if len(set(positional)) == len(positional) and not set(positional) & set(kwargs):
            fallback = positional
    return fallback + list(kwargs)


class ExportCall(nn.Module):
    """The model as both exporters see it: flat tensors in (the positional inputs, then the keyword
    inputs in order) and a tuple of tensors out, so dict inputs and ``ModelOutput`` outputs export like plain
    tensors. The tensors out are every tensor the model returns, or those ``outputs`` names
    (:mod:`workbench.export.outputs`); with ``output`` (one key, as metrics pick it), that entry's
    (:func:`~workbench.quant.algorithms.batches.select_output`). ``labels`` names the output tensors after the last
    call, and ``output_notes`` says what was left out.
    """

    def __init__(self, model: nn.Module, num_positional: int, keywords: Sequence[str], output: str | None,
                 outputs: Sequence[str] | None = None) -> None:
        super().__init__()
        self.model = model
        self.num_positional = num_positional
        self.keywords = list(keywords)
        self.output = output
        self.outputs = None if outputs is None else list(outputs)
        self.labels: list[str] = []
        self.output_notes: list[str] = []
        # set while the TorchScript exporter traces: the tensors after the model's inputs are the model's
        # parameters and buffers of these names, passed in (see workbench.export.torchscript_weights)
        self.weight_names: list[str] = []
        # while set (never while a graph is captured), given the model's own output of each call, before the
        # tensors the graph returns are picked from it: the parity batches' outputs, for the caller's headline
        self.on_result: Callable[[Any], None] | None = None
        # A new module is in training mode, and torch.onnx.export puts the module it exports back into the mode
        # it found it in, recursively: a wrapper left in training mode switched the whole model to training after
        # the first capture, and every later reference (another batch, the range check, a second exporter's
        # capture) ran BatchNorm on batch statistics, updating the running ones (EfficientNet's cosine 0.28).
        # The wrapper only exists to export, so it is made in eval mode (the model's own flag is untouched).
        self.training = False

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weights = {}
        if self.weight_names:
            count = len(tensors) - len(self.weight_names)
            weights = dict(zip(self.weight_names, tensors[count:]))
            tensors = tensors[:count]
        args = tensors[:self.num_positional]
        kwargs = dict(zip(self.keywords, tensors[self.num_positional:]))
        with _tensors_in_place_of(self.model, weights):
            result = self.model(*args, **kwargs)
        if self.on_result is not None:
            self.on_result(result)
        if self.output is not None and self.output != "":
            try:
                picked = select_output(result, self.output)
            except ValueError as error:
                raise ExportError(str(error)) from None
            chosen = flat_tensors(picked)
            self.labels = _output_labels(result, self.output, len(chosen))
            return tuple(chosen)
        try:
            named = pick_outputs(named_tensors(result), self.outputs)
        except ValueError as error:
            raise ExportError(str(error)) from None
        self.labels, self.output_notes = named.names, named.notes
        return tuple(named.tensors)


@contextlib.contextmanager
def _tensors_in_place_of(model: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """While inside, ``model``'s parameters and buffers named in ``tensors`` are those tensors (the traced inputs;
    ``torch.func.functional_call`` does the same but refuses to run under the TorchScript tracer). A tied
    tensor's other names follow it."""
    if not tensors:
        yield
        return
    by_identity = {id(t): name for name, t in list(model.named_parameters()) + list(model.named_buffers())}
    swapped: list[tuple[dict, str, torch.Tensor]] = []
    try:
        for module in model.modules():
            for store in (module._parameters, module._buffers):
                for key, original in list(store.items()):
                    name = by_identity.get(id(original)) if original is not None else None
                    if name in tensors:
                        swapped.append((store, key, original))
                        store[key] = tensors[name]
        yield
    finally:
        for store, key, original in reversed(swapped):
            store[key] = original


def _output_labels(output: Any, key: str | None, count: int) -> list[str]:
    """Output names: the ModelOutput / dict key the tensors come from, else ``output`` / ``output_N``."""
    label = key
    if label is None and isinstance(output, Mapping):
        label = next((str(k) for k, v in output.items() if flat_tensors(v)), None)
    if label is not None and not str(label).lstrip("-").isdigit():
        return [label] if count == 1 else [f"{label}_{i}" for i in range(count)]
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


@contextlib.contextmanager
def without_cache(model: nn.Module) -> Iterator[str | None]:
    """Switch a Hugging Face model's ``config.use_cache`` off while exporting (a cache object is no ONNX
    output); yields a note for the report when it did, and restores the setting afterwards."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "use_cache", None) is not True:
        yield None
        return
    config.use_cache = False
    try:
        yield ("exported with use_cache=False (the model's config has use_cache=True; its key/value cache "
               "is not an output of the ONNX graph)")
    finally:
        config.use_cache = True


def grow_sequence(inputs: tuple[torch.Tensor, ...], tokens: set[int]) -> tuple[torch.Tensor, ...]:
    """The inputs one token longer: token inputs (indices ``tokens``) repeat their last position, so ids
    stay in the vocabulary and masks stay masks."""
    return tuple(torch.cat([t, t[:, -1:]], 1) if i in tokens else t for i, t in enumerate(inputs))


def grow_batch(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The inputs with one more sample (the first repeated at the end, so values stay realistic)."""
    return tuple(torch.cat([t, t[:1]], 0) if t.dim() > 0 else t for t in inputs)


# ----- quantizer bookkeeping --------------------------------------------------------------------


def first_quantizer_names(model: nn.Module) -> dict[int, str]:
    """First qualified name of every TensorQuantizer object (a shared one keeps its first name)."""
    names: dict[int, str] = {}
    for name, q in quantizer_names(model).items():
        names.setdefault(id(q), name)
    return names


def check_quantizers(model: nn.Module, names: dict[int, str],
                      ) -> tuple[dict[int, TensorQuantizer], dict[int, ExportParams], list[TensorQuantizer]]:
    """The quantizers that export to Q/DQ, their ONNX parameters (computed once for the whole export), and
    the enabled quantizers calibration never reached (no amax while others have one): those export
    disabled, in float, and the caller says so.

    Raises QuantizerStateError naming every quantizer that cannot be exported (every enabled one
    uncalibrated: the model was never calibrated).
    """
    problems: dict[str, str] = {}
    active: dict[int, TensorQuantizer] = {}
    params: dict[int, ExportParams] = {}
    unreached: dict[str, TensorQuantizer] = {}
    # the layer type and role of each quantizer, for the TensorRT rules (any but a weight's is an activation's)
    roles = {id(q): ("weight" if attr.startswith("_weight_quantizer") else "input", type(layer).__name__)
             for layer in model.modules() if not isinstance(layer, nn.ModuleList)
             for attr, child in layer.named_children()
             for q in (child if isinstance(child, nn.ModuleList) else [child]) if isinstance(q, TensorQuantizer)}
    # a blockwise (INT4), FP8 or NVFP4 weight is quantized once, at export: its quantizer needs the layer's weight
    weights = {id(child): layer.weight for layer in model.modules()
               for attr, child in layer.named_children()
               if attr == "_weight_quantizer" and isinstance(child, TensorQuantizer)
               and isinstance(getattr(layer, "weight", None), torch.Tensor)}
    for module in all_quantizers(model):
        name = names[id(module)]
        role, layer_type = roles.get(id(module), ("input", "layer"))
        # a block size TensorRT does not take is refused when set; one an older project holds still exports, and
        # the lint names it (workbench.export.lint: int4_block_size)
        verdict = tensorrt_check(role, module.num_bits, module.axis, layer_type, block_size=module.block_size,
                                 block_sizes=False)
        if verdict.error and is_quantizing(module):
            problems[name] = verdict.error
            continue
        if module.is_calib_enabled and module.is_enabled:
            problems[name] = "still collecting calibration statistics (calibration did not finish)"
            continue
        if not is_quantizing(module):
            continue
        if not module.has_amax and not module.learn_amax:
            unreached.setdefault(name, module)
            continue
        try:
            # a weight's quantizer gets the weight: INT4, FP8 and NVFP4 weights are stored quantized
            params[id(module)] = export_params(module, weights.get(id(module)))
        except LookupError as error:
            problems[name] = f"enabled but {error}"
            continue
        except ValueError as error:
            problems[name] = str(error)
            continue
        active[id(module)] = module
    if unreached and not active:  # never calibrated at all: refuse, as a half-float export would mislead
        problems.update({name: "enabled but not calibrated (no amax)" for name in unreached})
    if problems:
        raise QuantizerStateError(problems)
    return active, params, list(unreached.values())


@contextlib.contextmanager
def rounding(quantizers: Sequence[TensorQuantizer], rounding: str) -> Iterator[None]:
    saved = [(q, q.rounding) for q in quantizers]
    try:
        for q in quantizers:
            q.rounding = rounding
        yield
    finally:
        for q, value in saved:
            q.rounding = value


@contextlib.contextmanager
def stand_ins(model: nn.Module, active: dict[int, TensorQuantizer], names: dict[int, str],
               params: dict[int, ExportParams]) -> Iterator[dict]:
    """Swap every active quantizer of this model instance for a QDQStandIn, and back afterwards.

    Only ``_modules`` entries of the instance change; a quantizer shared by several layers gets one
    stand-in, so the exported Q nodes share one scale initializer.
    """
    made: dict[int, QDQStandIn] = {}
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for parent in list(model.modules()):
            for attr, child in list(parent._modules.items()):
                if child is not None and id(child) in active:
                    if id(child) not in made:
                        made[id(child)] = QDQStandIn(names[id(child)], child, params[id(child)])
                    parent._modules[attr] = made[id(child)]
                    swapped.append((parent, attr, child))
        yield made
    finally:
        for parent, attr, child in reversed(swapped):
            parent._modules[attr] = child


@contextlib.contextmanager
def traced_module_scopes(root: nn.Module) -> Iterator[int]:
    """Let torch.export see the module scope of every GraphModule the functional rewrite put in the model.

    torch.export records which module each operation ran in, and the ONNX node names come from that
    (:mod:`workbench.export.naming`), but it inlines a ``GraphModule``'s forward into its parent without a
    scope: the softmax of a traced ``blocks.0.attn`` would be named ``blocks.0/Softmax``. For the export,
    each one is replaced by a plain module of its own class that shares its state (``__dict__``) and runs
    its generated forward, and put back afterwards. Yields how many were replaced.
    """
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for parent in list(root.modules()):
            for attr, child in list(parent._modules.items()):
                if isinstance(child, fx.GraphModule):
                    kind = type(child)
                    plain = type(kind.__name__, (nn.Module,), {"forward": kind.forward, "__module__": kind.__module__})
                    stand_in = plain.__new__(plain)
                    stand_in.__dict__ = child.__dict__  # the same submodules, parameters, buffers and constants
                    parent._modules[attr] = stand_in
                    swapped.append((parent, attr, child))
        yield len(swapped)
    finally:
        for parent, attr, child in reversed(swapped):
            parent._modules[attr] = child


class _LayerTracker:
    """Knows which layers are running: after an exception the innermost one is the last entered.

    Forward hooks do not run when a forward raises, so the stack keeps the failing path.
    """

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[tuple[str, str]] = []
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(name, type(module).__name__)))
            self.handles.append(module.register_forward_hook(self._leave))

    def _enter(self, name: str, type_name: str):
        def hook(module, args):
            self.stack.append((name, type_name))
        return hook

    def _leave(self, module, args, output):
        if self.stack:
            self.stack.pop()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def run_reference(model: nn.Module, inputs: tuple[torch.Tensor, ...], input_names: list[str],
                   active: dict[int, TensorQuantizer], names: dict[int, str], params: dict[int, ExportParams],
                   ) -> tuple[list[torch.Tensor], dict[str, int], int]:
    """Run the fake-quant model; name the failing layer on error.

    Also counts, per quantizer, how often it runs, and how many distinct (tensor, scale) pairs get
    quantized: the optimised ONNX graph has one Q/DQ pair per pair (two layers quantizing the same
    tensor with the same scale share it), which is what TensorRT wants.
    """
    calls: dict[str, int] = {}
    pairs: set[tuple] = set()
    held: list[torch.Tensor] = []  # keeps tensors alive so that their ids stay unique during the run
    handles = []
    for key, quantizer in active.items():
        name = names[key]
        p = params[key]
        signature = (p.scale.detach().cpu().numpy().tobytes(), tuple(p.scale.shape), p.qmin, p.qmax, p.clip)

        def count(module, args, output, name=name, signature=signature):
            calls[name] = calls.get(name, 0) + 1
            if args and isinstance(args[0], torch.Tensor):
                held.append(args[0])
                pairs.add((id(args[0]), signature))
        handles.append(quantizer.register_forward_hook(count))
    inner = model.model if isinstance(model, ExportCall) else model
    tracker = _LayerTracker(inner)
    try:
        with torch.no_grad():  # a copy: a model that edits its input in place must not change the sample
            output = model(*(t.clone() for t in inputs))  # that onnxruntime runs next
    except ExportError:
        raise
    except Exception as error:
        # the innermost layer that was entered and did not finish is where the shapes went wrong
        layer, layer_type = tracker.stack[-1] if tracker.stack else ("", type(inner).__name__)
        raise SampleInputError(layer, layer_type, {n: tuple(t.shape) for n, t in zip(input_names, inputs)},
                               error) from error
    finally:
        tracker.remove()
        for handle in handles:
            handle.remove()
    held.clear()
    tensors = flat_tensors(output)
    if not tensors:
        raise ExportError("The model returned no tensor; there is nothing to export.")
    return [t.detach() for t in tensors], calls, len(pairs)

