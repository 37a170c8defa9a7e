"""The CLI commands about the project itself: ``new`` (create one), ``show`` (what it holds) and ``set``
(layers, descriptors, rules and settings), with the data options and parsing they share.

Listed in :data:`COMMANDS` for :func:`workbench.cli.build_parser`, like :mod:`workbench.cli.engine`; they use
the helpers of :mod:`workbench.cli.common`, so errors, ``--json`` and exit codes behave as for every other
command.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from workbench.cli.common import (
    EXIT_OK,
    Command,
    UsageError,
    data_spec,
    emit,
    fmt,
    open_project,
    shown_name,
    typed_entrypoint,
)

__all__ = ["COMMANDS"]


def _parse_value(text: str) -> Any:
    from workbench.session.new_project import parse_value

    return parse_value(text)


def _parse_fields(text: str) -> dict[str, Any]:
    """``num_bits=8,axis=0,calib_method=histogram`` -> dict (values parsed as JSON where they can be)."""
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise UsageError(f"descriptor fields are name=value pairs separated by commas, got {part!r}.")
        key, value = part.split("=", 1)
        fields[key.strip()] = _parse_value(value.strip())
    return fields


def _cmd_new(args: argparse.Namespace) -> int:
    from workbench.session import Session
    from workbench.session.new_project import factory_arguments, new_project_settings
    from workbench.sources.data_source import InputSpec
    from workbench.sources.model_source import ModelSpec

    project = Path(args.project)
    if project.exists() and not args.force:
        raise UsageError(f"{project} exists; use --force to overwrite it.")
    model = ModelSpec.parse(args.model, weights=args.weights, kwargs=factory_arguments(args.model_kwargs),
                            code_dir=args.code_dir)
    calibration = data_spec(args.data, args, args.batch_size)
    evaluation = data_spec(args.eval_data, args, args.batch_size) if args.eval_data else None
    if evaluation is not None:
        evaluation.num_batches = None
    settings = new_project_settings(metric=args.metric, direction=args.metric_direction)
    if args.output_key:
        settings["output"] = args.output_key
    if args.num_batches is not None:  # what the help says: calibration uses this many, not the default
        settings["calibration"] = {"num_batches": args.num_batches}  # the other fields: their defaults
    session = Session.create(model, calibration, evaluation, trust_code=args.trust_code,
                             input_shape=InputSpec.parse_shape(args.input_shape), name=project.stem,
                             base_dir=Path.cwd(), settings=settings)
    path = session.save(project)
    summary = session.summary()
    text = (f"Created {path}: {summary['model_description']}, input {summary['input']}, "
            f"{summary['layers']} quantizable layers.")
    emit(args, summary, "\n".join([text] + _new_notes(summary)))
    return EXIT_OK


def _new_notes(summary: dict[str, Any]) -> list[str]:
    """What ``new`` decided that a user should hear at once: BatchNorms left unfolded (why), weight GEMMs and
    layers left in floating point (why)."""
    lines = []
    folding = summary["folding"]
    if folding["enabled"] and (folding["folded"] or folding["skipped"]):
        lines.append(f"  BatchNorm folding: {len(folding['folded'])} folded, {len(folding['skipped'])} not")
        lines += [f"    not folded: {item['bn']}: {item['reason']}" for item in folding["skipped"][:5]]
        if len(folding["skipped"]) > 5:
            lines.append(f"    ... and {len(folding['skipped']) - 5} more (workbench show lists them)")
    for item in summary["not_quantizable"] + summary["float_by_default"]:
        lines.append(f"  left in floating point: {item['name']} ({item['type']}): {item['reason']}")
    return lines


def _cmd_show(args: argparse.Namespace) -> int:
    from workbench.session.exports import suspicious_exports
    from workbench.sources.errors import TrustRequired

    try:
        session = open_project(args)
    except TrustRequired:
        from workbench.cli.trust import untrusted_summary

        data, text = untrusted_summary(args)
        emit(args, data, text)
        return EXIT_OK
    layers = session.layers()  # the summary counts them too: listed once
    summary = session.summary(layers)
    summary["layer_table"] = [layer.__dict__ for layer in layers]
    lines = [f"{shown_name(summary['name'])} ({summary['path']})", f"  model: {summary['model_description']}",
             f"  input: {summary['input']}", "  data: " + ", ".join(f"{k} {v}" for k, v in summary["data"].items())]
    run = summary["calibration"]
    if run is None:
        lines.append("  calibration: none yet")
    else:
        shared = run["quantizer_names"] - run["quantizers"]
        counted = f"{run['quantizers']} quantizers" + (f" ({run['quantizer_names']} names: {shared} shared by a rule)"
                                                         if shared else "")
        stale = run["output_sqnr_stale"]
        over = f" over {run['sqnr_batches']} batches" if run["sqnr_batches"] else " (first batch)"
        from workbench.quant.algorithms.precision import mix_label

        label = mix_label(session.precisions().values())
        lines.append(f"  calibration: {run['method']} on {run['batches']} batches, {counted}, output SQNR {label} vs "
                     f"FP32 {fmt(run['output_sqnr_db'], ' dB')}{over}" + (f" (stale: {'; '.join(stale)}; recalibrate "
                                                                  "for a current figure)" if stale else ""))
        if run["picked"]:
            lines.append("    auto picked " + ", ".join(f"{m} for {n}" for m, n in run["picked"].items()))
        for name, item in run["choices"].items():
            if item["reason"]:
                lines.append(f"    {name}: {item['reason']}")
            lines += [f"    warning: {message}" for message in item["warnings"]]
    settings = session.settings
    calibration = settings.calibration
    lines.append(f"  settings: calibration {calibration.method} on {calibration.num_batches or 'all'} batches "
                 f"(percentile {calibration.percentile}%), metric {settings.metric.name}; placement rules "
                 + ", ".join(f"{name} {'on' if on else 'off'}" for name, on in settings.rules.to_stored().items()))
    lines.extend(_folding_lines(summary["folding"]))
    lines.extend(_functional_lines(summary["functional"]))
    tuned = summary["finetune"]
    if tuned is not None:
        lines.append(f"  fine-tune: run {tuned['id']}: {tuned['summary']}")
        if tuned["status"] and "in use" not in tuned["status"]:
            lines.append(f"  warning: {tuned['status']}")
    for message in summary["file_changes"] + [f"recalibrate: {n}" for n in summary["stale_quantizers"][:5]]:
        lines.append(f"  warning: {message}")
    # a project received from someone else may carry a crafted export history: say what looks wrong in it
    summary["suspicious_exports"] = suspicious_exports(session.project, session.path, session.base_dir)
    lines += [f"  warning: suspicious export history: {note} (an export never overwrites it without --force)"
              for note in summary["suspicious_exports"]]
    lines.append(f"  layers: {summary['quantized_layers']} of {summary['layers']} quantized")
    lines += [f"    {item['name']} ({item['type']}): {item['reason']}" for item in summary["not_quantizable"]]
    lines += [f"    {item['name']} ({item['type']}): {item['reason']}" for item in summary["float_by_default"]]
    lines.append(f"    {'layer':<32} {'type':<20} {'precision':<9} {'input':<36} {'weight':<24} {'amax':<22} rank")
    for layer in layers:
        notes = f"  ({', '.join(layer.notes)})" if getattr(layer, "notes", None) else ""
        lines.append(f"    {layer.name:<32} {layer.display_type:<20} {layer.precision:<9} {layer.input_summary:<36} "
                     f"{layer.weight_summary:<24} "
                     f"{layer.amax_summary:<22} {layer.sensitivity_rank or '-'}{notes}")
    emit(args, summary, "\n".join(lines))
    return EXIT_OK


def _functional_lines(functional: dict[str, Any]) -> list[str]:
    """``workbench show``: functional quantizers, attention left in float (and why), untraced modules."""
    lines = [f"  functional: {functional['adds']} adds, {functional['concats']} concatenations, "
             f"{functional['matmuls']} matrix products, {functional['attentions']} attentions quantized; "
             f"{functional['left_float']} operations left in float"]
    if functional.get("found_at_run_time"):
        lines.append(f"    found by running the model (torch.fx cannot trace their forward): "
                     f"{len(functional['found_at_run_time'])} modules")
    for item in functional.get("left_float_operations", []):
        times = f" (and {item['count'] - 1} more like it)" if item["count"] > 1 else ""
        lines.append(f"    left in float: {item['module']}: {item['operation']}{times}: {item['reason']}")
    lines += [f"    attention not quantized: {item['module']}: {item['reason']}"
              for item in functional["unquantized_attention"]]
    lines += [f"    not traced: {item['module']} ({item['type']}): {item['reason']}"
              for item in functional["not_traced"][:5]]
    if len(functional["not_traced"]) > 5:
        lines.append(f"    ... and {len(functional['not_traced']) - 5} more modules not traced (--json lists them)")
    return lines


def _folding_lines(folding: dict[str, Any]) -> list[str]:
    """``workbench show``: which BatchNorms were folded into which layer, and which were left and why."""
    if not folding["enabled"]:
        return ["  BatchNorm folding: off"]
    pairs = ", ".join(f"{p['bn']} -> {p['layer']}" for p in folding["folded"]) or "none"
    lines = [f"  BatchNorm folding: on, {len(folding['folded'])} folded: {pairs}"]
    lines += [f"    not folded: {item['bn']}: {item['reason']}" for item in folding["skipped"]]
    return lines


def _cmd_set(args: argparse.Namespace) -> int:
    session = open_project(args)
    changed: dict[str, list[str]] = {}

    def pick(values: list[str] | None, by: str) -> list[str]:
        if not values:
            return []
        names = session.select(**{by: values})
        if not names:
            raise UsageError(f"no quantizable layer matches {by} {values}; see 'workbench show'.")
        return names

    # --layer, --pattern and --subtree add up; --type narrows what they chose (alone: every layer of the type)
    targets = pick(args.layer, "names") + pick(args.pattern, "patterns")
    if args.subtree:
        targets += session.select(subtree=args.subtree)
    targets = list(dict.fromkeys(targets))
    if args.type:
        of_type = set(pick(args.type, "types"))
        chosen = bool(args.layer or args.pattern or args.subtree)
        if chosen and not of_type & set(targets):
            raise UsageError(f"none of the layers chosen by --layer/--pattern/--subtree is of type "
                             f"{', '.join(args.type)}; see 'workbench show'.")
        targets = [name for name in targets if name in of_type] if chosen else sorted(
            of_type, key=list(session.project.layers).index)
    ignore = pick(args.ignore, "patterns")
    quantize = pick(args.quantize, "patterns")
    if ignore:
        changed["ignored"] = session.set_quantize(ignore, False)
    if quantize:
        changed["quantized"] = session.set_quantize(quantize, True)
    if (args.input_desc or args.weight_desc or args.reset or args.precision) and not targets:
        raise UsageError("say which layers with --layer, --pattern, --type or --subtree.")
    if args.block_size is not None and args.precision != "int4w":
        raise UsageError("--block-size goes with --precision int4w.")
    if args.reset:
        changed["reset"] = session.reset_descriptor(targets)
    if args.precision:
        changed[f"precision {args.precision}"] = session.set_precision(
            targets, args.precision, **({} if args.block_size is None else {"block_size": args.block_size}),
            fp8_weight_per_channel=args.fp8_weights != "per-tensor")
    notes: list[str] = []  # accepted, but the user should know (4-bit: simulation only)
    if args.input_desc:
        changed["input_descriptor"] = session.set_descriptor(targets, "input", **_parse_fields(args.input_desc))
        notes += session.notes
    if args.weight_desc:
        changed["weight_descriptor"] = session.set_descriptor(targets, "weight", **_parse_fields(args.weight_desc))
        notes += session.notes
    for rule in args.rule or []:
        name, _, value = rule.partition("=")
        session.update_setting("rules", **{name: bool(_parse_value(value or "true"))})
        changed.setdefault("rules", []).append(f"{name}={getattr(session.settings.rules, name)}")
    for pin in args.pin or []:
        first, _, second = pin.partition(",")
        if not second:
            raise UsageError(f"--pin takes two quantizer or layer names separated by a comma, got {pin!r}.")
        session.add_pins([(first.strip(), second.strip())])
        changed.setdefault("pins", []).append(pin)
    if args.metric:
        session.set_setting("metric", {"name": typed_entrypoint(args.metric, session),
                                       "direction": args.metric_direction})
        changed["metric"] = [args.metric]
    if args.device:
        session.set_setting("device", args.device)
        changed["device"] = [args.device]
    from workbench.project.settings import FUNCTIONAL_SWITCHES

    switches = list(args.functional or [])
    if args.quantize_residual_adds is not None:
        switches.append(f"residual_adds_in_transformer_blocks={args.quantize_residual_adds}")
    for switch in switches:
        name, _, value = switch.partition("=")
        if name not in FUNCTIONAL_SWITCHES:
            raise UsageError(f"unknown functional switch {name!r}; switches are {', '.join(FUNCTIONAL_SWITCHES)}.")
        if value not in ("on", "off", "true", "false"):
            raise UsageError(f"--functional {name} takes on or off, got {value!r}.")
        session.update_setting("functional", **{name: value in ("on", "true")})
        state = "on" if getattr(session.settings.functional, name) else "off"
        changed.setdefault("functional", []).append(f"{name}={state}")
    if args.output_key is not None:
        session.set_setting("output", args.output_key or None)
        changed["output"] = [args.output_key or "first tensor"]
    for role, text in (("calibration", args.data), ("evaluation", args.eval_data)):
        if text:  # checked as `new` checks it: the inputs must fit the model
            batch_size = args.batch_size or (session.project.data[role].batch_size if role in session.project.data
                                              else session.project.data["calibration"].batch_size)
            typed = data_spec(text, args, batch_size)  # relative to where it was typed
            if role == "evaluation":
                typed.num_batches = None
            session.set_data(role, typed.absolute(Path.cwd()).relative_to(session.base_dir))
            changed[f"{role} data"] = [session.project.data[role].label]
    if args.num_batches is not None:  # with or without new data: what --help promises
        session.update_setting("calibration", num_batches=args.num_batches)
        changed["calibration batches"] = [str(session.settings.calibration.num_batches)]
    if args.batch_size is not None and not args.data and not args.eval_data:  # the data kept, batched anew
        for role, spec in list(session.project.data.items()):
            session.set_data(role, dataclasses.replace(spec, batch_size=args.batch_size))
        changed["batch size"] = [f"{role} {spec.batch_size}" for role, spec in session.project.data.items()]
    if args.fold_bn is not None:
        session.set_setting("fold_bn", args.fold_bn == "on")
        folded = session.folded_layers()
        changed["fold_bn"] = [f"{bn} -> {layer}" for layer, bn in folded.items()] if folded else [args.fold_bn]
        if session.build_report.stale:
            changed["recalibrate"] = list(session.build_report.stale)
    from workbench.project.settings import EXPORT_CHECKS

    for item in args.export or []:
        name, _, value = item.partition("=")
        if name not in EXPORT_CHECKS or not value:
            raise UsageError(f"--export takes NAME=VALUE with NAME one of {', '.join(EXPORT_CHECKS)}, got {item!r}.")
        session.update_setting("export", **{name: _parse_value(value)})
        changed.setdefault("export", []).append(f"{name}={getattr(session.settings.export, name)}")
    if not changed:
        raise UsageError("nothing to change: see 'workbench set --help'.")
    session.save()
    text = "\n".join([f"{what}: {', '.join(names) if names else 'no change'}" for what, names in changed.items()]
                     + [f"note: {note}" for note in notes])
    emit(args, {**changed, "notes": notes} if notes else changed, text)
    return EXIT_OK


def _data_options(command: argparse.ArgumentParser, default_batches: int, *, required: bool) -> None:
    """The data options of ``new`` and of ``set`` (which changes a project's data with the same checks)."""
    from workbench.sources.data_source import DataSpec  # its defaults are the options' defaults

    command.add_argument("--data", required=required, help="calibration data: a folder of images, a folder of "
                         ".npy files, a tensor file (.npy/.npz/.safetensors/.pt), file.py:function, or demo:digits")
    command.add_argument("--eval-data", help="evaluation data (same forms; default: the calibration data)")
    command.add_argument("--batch-size", type=int, default=DataSpec.batch_size if required else None,
                         help=f"samples per batch (default: {DataSpec.batch_size}"
                              + ("" if required else "; set: as the data had") + ")")
    command.add_argument("--num-batches", type=int, help=f"calibration batches to use (default: {default_batches}, "
                                                          "or all the data has if fewer)")
    command.add_argument("--shuffle", action="store_true")
    command.add_argument("--seed", type=int, default=DataSpec.seed)
    command.add_argument("--resize", type=int, help="images: resize the shorter side to this")
    command.add_argument("--crop", type=int, help="images: center crop to this size")
    command.add_argument("--mean", type=float, nargs="+", help="images: per-channel mean to subtract")
    command.add_argument("--std", type=float, nargs="+", help="images: per-channel std to divide by")
    command.add_argument("--grayscale", action="store_true", help="images: one channel")


# The options of each command, added when it is chosen (workbench.cli.entry): the registries their choices and
# help texts come from are imported here, not for `workbench --help`. Every default a help text names is read
# from the project settings' defaults: one source of truth.


def _new_options(new: argparse.ArgumentParser) -> None:
    from workbench.analysis.metrics import DIRECTIONS, metric_choices_text
    from workbench.project.settings import DEFAULTS

    new.add_argument("--model", required=True, help="file.py:factory, package.module:factory, model.pt (a pickled "
                                                    "model), demo:digits / demo:resnet18 / demo:resnet50, hf:DIR (a "
                                                    "local Hugging Face folder) or timm:NAME[@weights.safetensors]")
    new.add_argument("--model-kwargs", help="keyword arguments of the factory: name=value,... or a YAML/JSON "
                                            "mapping ('num_classes: 10, pretrained: false')")
    new.add_argument("--weights", help="state_dict file (.pt/.pth loaded with weights_only, or .safetensors)")
    new.add_argument("--code-dir", help="folder with the code a pickled model needs (default: its folder)")
    new.add_argument("--input-shape", help="per-sample input shape to check the data against, e.g. 3,224,224 "
                                           "(optional: the data gives it)")
    _data_options(new, DEFAULTS.calibration.num_batches, required=True)
    new.add_argument("--output-key", help="the model output entry that metrics and sensitivity compare (export "
                                          "keeps every output; pick them with export --outputs): a dict/ModelOutput "
                                          "key such as logits, or a tuple index (default: the first tensor)")
    new.add_argument("--metric", help=f"{metric_choices_text()} (default: {DEFAULTS.metric.name})")
    new.add_argument("--metric-direction", choices=DIRECTIONS, help="for a user metric")
    new.add_argument("--force", action="store_true", help="overwrite an existing project file")
    new.set_defaults(func=_cmd_new)


def _show_options(show: argparse.ArgumentParser) -> None:
    show.set_defaults(func=_cmd_show)


def _set_options(set_: argparse.ArgumentParser) -> None:
    from workbench.analysis.metrics import DIRECTIONS, metric_choices_text
    from workbench.project.settings import (  # one definition of each
        DEFAULTS,
        EXPORT_CHECKS,
        FUNCTIONAL_SWITCHES,
        RULES,
    )
    from workbench.quant.algorithms.precision_registry import Precision, precision_choices_text
    from workbench.quant.algorithms.tensorrt_rules import INT4_BLOCK_SIZES

    set_.add_argument("--layer", action="append", help="a layer name, exactly (repeatable; for a regex use --pattern)")
    set_.add_argument("--pattern", action="append", help="layers whose name matches this regex (repeatable)")
    set_.add_argument("--type", action="append",
                      help="layers of this type, e.g. Conv2d (repeatable). With --layer/--pattern/--subtree it narrows "
                           "their choice (--pattern attn --type Linear: the Linear layers matching attn); alone, "
                           "every layer of the type. --layer, --pattern and --subtree add up")
    set_.add_argument("--subtree", help="every layer under this module, e.g. layer1")
    set_.add_argument("--ignore", action="append", help="leave layers matching this regex in float (repeatable)")
    set_.add_argument("--quantize", action="append", help="quantize layers matching this regex (repeatable)")
    set_.add_argument("--input-desc", help="input descriptor fields for the chosen layers: num_bits=8,calib_method="
                                           "histogram,unsigned=true,narrow_range=false,axis=none")
    set_.add_argument("--weight-desc", help="weight descriptor fields for the chosen layers, e.g. num_bits=4,axis=0")
    set_.add_argument("--reset", action="store_true", help="back to default descriptors for the chosen layers")
    set_.add_argument("--precision", choices=[p.value for p in Precision],
                      help="run the chosen layers in this precision (their descriptors become its): "
                           + precision_choices_text().replace("%", "%%"))
    set_.add_argument("--block-size", type=int,
                      help=f"int4w: weight elements per scale along the input features: "
                           f"{' or '.join(map(str, sorted(INT4_BLOCK_SIZES)))} (what TensorRT builds), dividing each "
                           "layer's input features (default: the largest that does)")
    set_.add_argument("--fp8-weights", choices=["per-channel", "per-tensor"], default="per-channel",
                      help="fp8: one weight scale per output channel (default) or one per tensor")
    set_.add_argument("--rule", action="append", metavar="RULE=true|false",
                      help="switch a TensorRT placement rule on or off (repeatable): "
                           + ", ".join(RULES) + " (all on by default), e.g. --rule concat=false; "
                           "'workbench show' lists them")
    set_.add_argument("--pin", action="append", help="share one quantizer between two: NAME1,NAME2 (repeatable)")
    set_.add_argument("--metric", help=f"the project's metric: {metric_choices_text()}")
    set_.add_argument("--metric-direction", choices=DIRECTIONS)
    set_.add_argument("--device", help="cpu, cuda, cuda:1 ...")
    set_.add_argument("--functional", action="append", metavar="SWITCH=on|off",
                      help="which functional operations get quantizers (repeatable): " + "; ".join(
                          f"{name}: {text}" for name, text in FUNCTIONAL_SWITCHES.items()))
    set_.add_argument("--quantize-residual-adds", choices=["on", "off"],
                      help=FUNCTIONAL_SWITCHES["residual_adds_in_transformer_blocks"].replace("%", "%%"))
    set_.add_argument("--output-key", help="the model output entry to compare and export (logits, 0...; empty: the "
                                           "first tensor)")
    _data_options(set_, DEFAULTS.calibration.num_batches, required=False)
    set_.add_argument("--export", action="append", metavar="NAME=VALUE",
                      help="an export setting (repeatable): " + "; ".join(
                          f"{name}: {text} (default {getattr(DEFAULTS.export, name)})"
                          for name, text in EXPORT_CHECKS.items()))
    set_.add_argument("--fold-bn", choices=["on", "off"],
                      help="fold BatchNorm into the layer before it (as TensorRT does); on by default")
    set_.set_defaults(func=_cmd_set)


COMMANDS: tuple[Command, ...] = (
    Command("new", "create a project on a model and data", _new_options),
    Command("show", "print a project's model, data, layers and results (untrusted: the code it would run)",
            _show_options),
    Command("set", "quantize or ignore layers, set descriptors, rules and settings", _set_options),
)
