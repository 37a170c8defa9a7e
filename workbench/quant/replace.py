"""Convert an existing model to quantized modules, in place, with an ignore policy and a report."""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import nn

import workbench.quant.quant_modules as quant_modules
from workbench.quant.equivalence import forward_matches_base
from workbench.quant.gemm import known_linear_like, unknown_weight_gemm
from workbench.quant.nn.modules.quant_experts import QuantExperts, is_experts_module
from workbench.quant.nn.modules.quant_linear import QuantLinear
from workbench.quant.nn.modules.quant_router import is_router_module, router_quant_class
from workbench.quant.parametrized import parametrized_base, parametrized_quant_class
from workbench.quant.tensor_quant import QuantDescriptor

__all__ = ["IgnorePolicy", "ReplacedLayer", "IgnoredLayer", "ReplacementReport", "replace_to_quantization_module",
           "ignore_matcher", "default_quant_map", "quantized_class_for"]

IgnorePolicy = str | Iterable[str] | Callable[[str], bool] | None


@dataclass(frozen=True)
class ReplacedLayer:
    name: str
    float_type: str
    quant_type: str


@dataclass(frozen=True)
class IgnoredLayer:
    name: str
    float_type: str
    reason: str  # the pattern that matched, or "callable"


@dataclass
class ReplacementReport:
    """What :func:`replace_to_quantization_module` did, layer by layer.

    ``not_quantizable`` lists subclasses of quantizable layers that change what the layer computes
    (their own ``forward``), and modules of unknown classes holding a weight matrix (a GEMM the core
    cannot quantize, :func:`workbench.quant.gemm.unknown_weight_gemm`): they stay float, with the reason.
    """

    replaced: list[ReplacedLayer] = field(default_factory=list)
    ignored: list[IgnoredLayer] = field(default_factory=list)
    not_quantizable: list[IgnoredLayer] = field(default_factory=list)

    @property
    def replaced_names(self) -> list[str]:
        return [layer.name for layer in self.replaced]

    @property
    def ignored_names(self) -> list[str]:
        return [layer.name for layer in self.ignored]

    def summary(self) -> str:
        text = f"{len(self.replaced)} layers quantized, {len(self.ignored)} ignored"
        if self.not_quantizable:
            text += f", {len(self.not_quantizable)} not quantizable (custom forward or unknown weight GEMM)"
        return text


def default_quant_map() -> dict[type, type]:
    """Float module class -> quantized class, for every layer type the core can quantize."""
    return {quant_modules.FLOAT_CLASSES[e.mod_name]: e.replace_mod for e in quant_modules._DEFAULT_QUANT_MAP}


# Methods a subclass may override without changing what the layer computes.
_HARMLESS_OVERRIDES = frozenset({"__init__", "__repr__", "extra_repr", "reset_parameters", "__setstate__",
                                 "_load_from_state_dict", "_save_to_state_dict"})


def quantized_class_for(module: nn.Module, mapping: dict[type, type]) -> tuple[type | None, str | None]:
    """The quantized class for ``module`` and, when it cannot have one, why.

    A layer of a mapped type, or of a subclass that computes the same (its ``forward`` inherited, or
    only ``return super().forward(...)`` with its own arguments; e.g. ``nn.MultiheadAttention.out_proj``'s
    ``NonDynamicallyQuantizableLinear`` or timm's ``Linear``), gets the base's quantized class. A
    subclass overriding ``forward`` (or another method the computation uses) gets ``(None, "not
    quantizable: custom forward")``. Anything else, or an already quantized module: ``(None, None)``.
    """
    cls = type(module)
    if cls in mapping:
        return mapping[cls], None
    base = parametrized_base(cls)
    if base in mapping:  # a weight-normed Conv1d (torch.nn.utils.parametrize): its base's class, reading its weight
        return parametrized_quant_class(cls, mapping[base]), None
    quantized = tuple(mapping.values())
    if quantized and isinstance(module, quantized):
        return None, None
    known = known_linear_like(cls)
    # a Linear-like of another library (HF Conv1D, timm Linear), when the mapping quantizes Linears at all
    if known is not None and QuantLinear in quantized:
        klass, quant_cls = known
        changed = _overridden_computation(cls, klass)
        if changed is not None:
            return None, f"not quantizable: custom {changed} (a subclass of {klass.__name__})"
        return quant_cls, None
    # transformers' mixture-of-experts experts (3-D gate_up_proj/down_proj), whatever the family names the class
    if QuantLinear in quantized and is_experts_module(module):
        return QuantExperts, None
    if QuantLinear in quantized and is_router_module(module):  # their [E, H] gate GEMM
        return router_quant_class(cls), None
    for base in cls.__mro__[1:]:
        if base in mapping:
            changed = _overridden_computation(cls, base)
            if changed is not None:
                return None, (f"not quantizable: custom {changed} ({cls.__name__} replaces {base.__name__}'s "
                              f"{changed}, so it may compute something else; it stays in floating point)")
            return mapping[base], None
    return None, None


def _overridden_computation(cls: type, base: type) -> str | None:
    """The first method between ``cls`` and ``base`` in the MRO that replaces one of ``base``'s
    computation, or None when the subclass computes what ``base`` does."""
    for klass in cls.__mro__:
        if klass is base:
            return None
        for attr, value in vars(klass).items():
            if attr in _HARMLESS_OVERRIDES or not inspect.isfunction(value) or not hasattr(base, attr):
                continue
            if attr == "forward" and (_only_calls_super(value) or forward_matches_base(cls, base)):
                continue  # hands on to the base's forward, or writes its formula out (HF FalconLinear)
            return attr
    return None


def _only_calls_super(function: Callable) -> bool:
    """Whether ``function`` is ``return super().forward(<its own arguments, in order>)`` (docstring allowed)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):  # no source to read: assume it computes something else
        return False
    definition = tree.body[0] if tree.body else None
    if not isinstance(definition, ast.FunctionDef):
        return False
    body = [s for s in definition.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
        return False
    call = body[0].value
    target = call.func
    if not (isinstance(target, ast.Attribute) and target.attr == function.__name__
            and isinstance(target.value, ast.Call) and isinstance(target.value.func, ast.Name)
            and target.value.func.id == "super"):
        return False
    args = definition.args
    params = [a.arg for a in args.posonlyargs + args.args][1:] + [a.arg for a in args.kwonlyargs]
    positional: list[str] = []
    for value in call.args:  # the parameters themselves, in order, or *args passed on
        if isinstance(value, ast.Starred) and isinstance(value.value, ast.Name) and args.vararg is not None \
                and value.value.id == args.vararg.arg:
            continue
        if not isinstance(value, ast.Name):
            return False
        positional.append(value.id)
    named: list[str] = []
    for keyword in call.keywords:  # name=name, or **kwargs passed on
        if keyword.arg is None:
            if not (isinstance(keyword.value, ast.Name) and args.kwarg is not None
                    and keyword.value.id == args.kwarg.arg):
                return False
        elif isinstance(keyword.value, ast.Name) and keyword.value.id == keyword.arg:
            named.append(keyword.arg)
        else:
            return False
    return positional == params[:len(positional)] and sorted(positional + named) == sorted(params)


def ignore_matcher(ignore_policy: IgnorePolicy) -> Callable[[str], str | None]:
    """A function from a layer name to the reason it is ignored (the matching pattern), or None.

    ``ignore_policy`` is a regular expression matched at the start of the qualified name
    (``re.match``, as the reference scripts do; an exact name also matches), a list of them, or a
    callable returning True for names to ignore.

    Raises:
        ValueError: a pattern is not a valid regular expression (the message names it).
        TypeError: the policy is of another type.
    """
    if ignore_policy is None:
        return lambda name: None
    if callable(ignore_policy):
        def by_callable(name: str) -> str | None:
            return "callable" if ignore_policy(name) else None
        return by_callable
    if isinstance(ignore_policy, str):
        patterns = [ignore_policy]
    else:
        try:
            patterns = list(ignore_policy)
        except TypeError:
            raise TypeError("ignore_policy must be a regex string, a list of them, or a callable on the layer "
                            f"name, got {type(ignore_policy).__name__}.") from None
    compiled = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(f"ignore_policy patterns must be strings, got {pattern!r}.")
        try:
            compiled.append((pattern, re.compile(pattern)))
        except re.error as error:
            raise ValueError(f"ignore_policy pattern {pattern!r} is not a valid regular expression: {error}.") from None

    def by_pattern(name: str) -> str | None:
        for pattern, regex in compiled:
            if name == pattern or regex.match(name):
                return pattern
        return None
    return by_pattern


DescriptorChoice = Callable[[str, nn.Module], "tuple[QuantDescriptor | None, QuantDescriptor | None]"]


def replace_to_quantization_module(model: nn.Module, ignore_policy: IgnorePolicy = None, *,
                                   quant_map: dict[type, type] | None = None,
                                   quant_desc_input: QuantDescriptor | None = None,
                                   quant_desc_weight: QuantDescriptor | None = None,
                                   descriptor_for: DescriptorChoice | None = None) -> ReplacementReport:
    """Swap every quantizable submodule of ``model`` for its quantized counterpart, in place.

    The quantized module shares the float module's parameters and buffers, so names and state_dict
    keys are unchanged (quantizer buffers are added). No class of the user's model is modified.
    Modules are matched by type, subclasses included when they compute what their base does (see
    :func:`quantized_class_for`); a subclass with its own forward stays float and is listed in
    ``report.not_quantizable`` with the reason.

    Args:
        model: the model to convert.
        ignore_policy: layers to leave in floating point (see :func:`ignore_matcher`).
        quant_map: float class -> quantized class; defaults to :func:`default_quant_map`.
        quant_desc_input, quant_desc_weight: descriptors for the new quantizers; default to each
            quantized class's defaults.
        descriptor_for: ``(name, float_module) -> (input_desc, weight_desc)`` for per-layer choices;
            a None in the pair falls back to ``quant_desc_input`` / ``quant_desc_weight``.

    Returns:
        A :class:`ReplacementReport` listing replaced and ignored layers in model order.

    Raises:
        ValueError: ``model`` itself is a quantizable layer (it cannot be swapped in place; wrap it or
            use ``QuantConv2d.from_float(model)``).
    """
    mapping = default_quant_map() if quant_map is None else dict(quant_map)
    is_ignored = ignore_matcher(ignore_policy)
    report = ReplacementReport()
    if quantized_class_for(model, mapping)[0] is not None:
        replacement = quantized_class_for(model, mapping)[0].__name__
        raise ValueError(f"The model itself is a {type(model).__name__}; replace_to_quantization_module swaps "
                         f"submodules in place. Use {replacement}.from_float(model) instead.")

    def visit(module: nn.Module, prefix: str) -> None:
        for child_name, child in list(module._modules.items()):
            if child is None:
                continue
            path = child_name if not prefix else f"{prefix}.{child_name}"
            visit(child, path)
            quant_cls, unsupported = quantized_class_for(child, mapping)
            if unsupported is not None:
                report.not_quantizable.append(IgnoredLayer(path, type(child).__name__, unsupported))
                continue
            if quant_cls is None:
                gemm = unknown_weight_gemm(child) if not child._modules and mapping else None
                if gemm is not None:
                    report.not_quantizable.append(IgnoredLayer(path, type(child).__name__, gemm))
                continue
            reason = is_ignored(path)
            if reason is not None:
                report.ignored.append(IgnoredLayer(path, type(child).__name__, reason))
                continue
            input_desc, weight_desc = descriptor_for(path, child) if descriptor_for else (None, None)
            kwargs = {"quant_desc_input": input_desc or quant_desc_input}
            if hasattr(quant_cls, "default_quant_desc_weight"):
                kwargs["quant_desc_weight"] = weight_desc or quant_desc_weight
            module._modules[child_name] = quant_cls.from_float(child, **kwargs)
            report.replaced.append(ReplacedLayer(path, type(child).__name__, quant_cls.__name__))

    visit(model, "")
    return report
