"""The ``workbench`` command line: the headless twin of the GUI, over :mod:`workbench.session`.

Exit codes: 0 success, 2 bad input or usage (one clear line on stderr), 1 internal error. Tracebacks
only with ``--debug``. ``--json`` prints machine-readable results on stdout.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench import __version__

logger = logging.getLogger("workbench")

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


# ----- helpers -----------------------------------------------------------------------------------


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parse_fields(text: str) -> dict[str, Any]:
    """``num_bits=8,axis=0,calib_method=histogram`` -> dict (values parsed as JSON where they can be)."""
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise UsageError(f"descriptor fields are name=value pairs separated by commas, got {part!r}.")
        key, value = part.split("=", 1)
        fields[key.strip()] = _parse_value(value.strip())
    return fields


class _Progress:
    """A tqdm bar for one job (silent with --json or when stderr is not a terminal) and Ctrl-C as cancel."""

    def __init__(self, args: argparse.Namespace, description: str, shown: bool = True) -> None:
        self.cancel = threading.Event()
        self.bar = None
        self.description = description
        self.enabled = shown and not args.json and sys.stderr.isatty()
        self._previous_handler = None

    def __enter__(self) -> _Progress:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGINT, self._interrupt)
        return self

    def _interrupt(self, signum, frame) -> None:
        if self.cancel.is_set():
            raise KeyboardInterrupt
        self.cancel.set()
        print("\nworkbench: cancelling after the current step (Ctrl-C again to abort)", file=sys.stderr)

    def __call__(self, done: int, total: int, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total or None, desc=self.description, unit="step", leave=False)
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(message[-40:])

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)


def _open(args: argparse.Namespace):
    from workbench.session import Session

    return Session.open(args.project, trust_code=args.trust_code)


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=2, default=_json_default))
    else:
        print(text)


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.4g}{unit}"


# ----- commands ----------------------------------------------------------------------------------


def _cmd_version(args: argparse.Namespace) -> int:
    import torch

    from workbench.quant import backend_name

    print(f"Quant Workbench {__version__} (torch {torch.__version__}, CPU fake-quant kernel: {backend_name()})")
    return EXIT_OK


def _data_spec(text: str, args: argparse.Namespace, batch_size: int):
    from workbench.sources.data_source import DataSpec, ImageOptions

    image = None
    if any(v is not None for v in (args.resize, args.crop, args.mean, args.std)) or args.grayscale:
        image = ImageOptions(resize=args.resize, crop=args.crop,
                             mean=tuple(args.mean or ((0.0,) if args.grayscale else (0.0, 0.0, 0.0))),
                             std=tuple(args.std or ((1.0,) if args.grayscale else (1.0, 1.0, 1.0))),
                             grayscale=args.grayscale)
    return DataSpec.parse(text, batch_size=batch_size, num_batches=args.num_batches, shuffle=args.shuffle,
                          seed=args.seed, image=image)


def _typed_entrypoint(spec: str | None, session: Any) -> str | None:
    """A ``file.py:function`` typed on the command line names a file relative to where it was typed; the
    project keeps it relative to its own folder (which may be elsewhere)."""
    from workbench.sources.paths import absolute_entrypoint, relative_entrypoint

    return None if spec is None else relative_entrypoint(absolute_entrypoint(spec, Path.cwd()), session.base_dir)


def _cmd_new(args: argparse.Namespace) -> int:
    from workbench.session import Session
    from workbench.sources.data_source import InputSpec
    from workbench.sources.model_source import ModelSpec

    project = Path(args.project)
    if project.exists() and not args.force:
        raise UsageError(f"{project} exists; use --force to overwrite it.")
    kwargs = _parse_fields(args.model_kwargs) if args.model_kwargs else {}
    model = ModelSpec.parse(args.model, weights=args.weights, kwargs=kwargs, code_dir=args.code_dir)
    calibration = _data_spec(args.data, args, args.batch_size)
    evaluation = _data_spec(args.eval_data, args, args.batch_size) if args.eval_data else None
    if evaluation is not None:
        evaluation.num_batches = None
    settings: dict[str, Any] = {}
    if args.metric:
        settings["metric"] = {"name": args.metric, "direction": args.metric_direction}
    session = Session.create(model, calibration, evaluation, trust_code=args.trust_code,
                             input_shape=InputSpec.parse_shape(args.input_shape), name=project.stem,
                             base_dir=Path.cwd(), settings=settings)
    path = session.save(project)
    summary = session.summary()
    _emit(args, summary, f"Created {path}: {summary['model_description']}, input {summary['input']}, "
                         f"{summary['layers']} quantizable layers.")
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    session = _open(args)
    layers = session.layers()  # the summary counts them too: listed once
    summary = session.summary(layers)
    summary["layer_table"] = [layer.__dict__ for layer in layers]
    lines = [f"{summary['name']} ({summary['path']})", f"  model: {summary['model_description']}",
             f"  input: {summary['input']}", "  data: " + ", ".join(f"{k} {v}" for k, v in summary["data"].items())]
    run = summary["calibration"]
    lines.append("  calibration: " + ("none yet" if run is None else
                                      f"{run['method']} on {run['batches']} batches, output SQNR "
                                      f"{_fmt(run['output_sqnr_db'], ' dB')}"))
    lines.extend(_folding_lines(summary["folding"]))
    tuned = summary["finetune"]
    if tuned is not None:
        lines.append(f"  fine-tune: run {tuned['id']}: {tuned['summary']}")
        if tuned["status"] and "in use" not in tuned["status"]:
            lines.append(f"  warning: {tuned['status']}")
    for message in summary["file_changes"] + [f"recalibrate: {n}" for n in summary["stale_quantizers"][:5]]:
        lines.append(f"  warning: {message}")
    lines.append(f"  layers: {summary['quantized_layers']} of {summary['layers']} quantized")
    lines.append(f"    {'layer':<32} {'type':<20} {'input':<28} {'weight':<24} {'amax':<22} rank")
    for layer in layers:
        notes = f"  ({', '.join(layer.notes)})" if getattr(layer, "notes", None) else ""
        lines.append(f"    {layer.name:<32} {layer.type:<20} {layer.input_summary:<28} {layer.weight_summary:<24} "
                     f"{layer.amax_summary:<22} {layer.sensitivity_rank or '-'}{notes}")
    _emit(args, summary, "\n".join(lines))
    return EXIT_OK


def _folding_lines(folding: dict[str, Any]) -> list[str]:
    """``workbench show``: which BatchNorms were folded into which layer, and which were left and why."""
    if not folding["enabled"]:
        return ["  BatchNorm folding: off"]
    pairs = ", ".join(f"{p['bn']} -> {p['layer']}" for p in folding["folded"]) or "none"
    lines = [f"  BatchNorm folding: on, {len(folding['folded'])} folded: {pairs}"]
    lines += [f"    not folded: {item['bn']}: {item['reason']}" for item in folding["skipped"]]
    return lines


def _cmd_set(args: argparse.Namespace) -> int:
    session = _open(args)
    changed: dict[str, list[str]] = {}

    def pick(values: list[str] | None, by: str) -> list[str]:
        if not values:
            return []
        names = session.select(**{by: values})
        if not names:
            raise UsageError(f"no quantizable layer matches {by} {values}; see 'workbench show'.")
        return names

    targets = pick(args.layer, "names") + pick(args.pattern, "patterns") + pick(args.type, "types")
    if args.subtree:
        targets += session.select(subtree=args.subtree)
    targets = list(dict.fromkeys(targets))
    ignore = pick(args.ignore, "patterns")
    quantize = pick(args.quantize, "patterns")
    if ignore:
        changed["ignored"] = session.set_quantize(ignore, False)
    if quantize:
        changed["quantized"] = session.set_quantize(quantize, True)
    if (args.input_desc or args.weight_desc or args.reset) and not targets:
        raise UsageError("say which layers with --layer, --pattern, --type or --subtree.")
    if args.reset:
        changed["reset"] = session.reset_descriptor(targets)
    if args.input_desc:
        changed["input_descriptor"] = session.set_descriptor(targets, "input", **_parse_fields(args.input_desc))
    if args.weight_desc:
        changed["weight_descriptor"] = session.set_descriptor(targets, "weight", **_parse_fields(args.weight_desc))
    for rule in args.rule or []:
        name, _, value = rule.partition("=")
        rules = dict(session.project.settings["rules"])
        if name not in rules:
            raise UsageError(f"unknown rule {name!r}; rules are {', '.join(rules)}.")
        rules[name] = bool(_parse_value(value or "true"))
        session.set_setting("rules", rules)
        changed.setdefault("rules", []).append(f"{name}={rules[name]}")
    for pin in args.pin or []:
        first, _, second = pin.partition(",")
        if not second:
            raise UsageError(f"--pin takes two quantizer or layer names separated by a comma, got {pin!r}.")
        pins = list(session.project.settings["pins"]) + [[first.strip(), second.strip()]]
        session.set_setting("pins", pins)
        session.quantized_model()  # validates the names now
        changed.setdefault("pins", []).append(pin)
    if args.metric:
        session.set_setting("metric", {"name": _typed_entrypoint(args.metric, session),
                                       "direction": args.metric_direction})
        changed["metric"] = [args.metric]
    if args.device:
        session.set_setting("device", args.device)
        changed["device"] = [args.device]
    if args.fold_bn is not None:
        session.set_setting("fold_bn", args.fold_bn == "on")
        folded = session.folded_layers()
        changed["fold_bn"] = [f"{bn} -> {layer}" for layer, bn in folded.items()] if folded else [args.fold_bn]
        if session.build_report.stale:
            changed["recalibrate"] = list(session.build_report.stale)
    if not changed:
        raise UsageError("nothing to change: see 'workbench set --help'.")
    session.save()
    _emit(args, changed, "\n".join(f"{what}: {', '.join(names) if names else 'no change'}"
                                   for what, names in changed.items()))
    return EXIT_OK


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from workbench.launcher import job_context

    with job_context() as context:
        session = _open(args)
        with _Progress(args, "calibrating", context.is_main) as progress:
            result = session.calibrate(method=args.method, num_batches=args.num_batches,
                                       percentile=args.percentile, progress=progress, cancel=progress.cancel,
                                       context=context)
    if not context.is_main:  # rank 0 writes the project and reports for the job
        return EXIT_OK
    session.save()
    data = {"summary": result.summary(), "method": result.method, "batches": result.num_batches,
            "world_size": context.world_size,
            "output_sqnr_db": result.output_sqnr_db, "warnings": result.warnings, "unused": result.unused,
            "quantizers": {n: {"amax": q.amax.tolist(), "method": q.method, "samples": q.num_samples,
                               "nonfinite": q.nonfinite_count} for n, q in result.quantizers.items()}}
    if args.evaluate:
        data["evaluation"] = session.evaluate()
    lines = [result.summary()] + [f"warning: {w}" for w in result.warnings]
    if args.evaluate:
        lines.append("evaluation: " + ", ".join(f"{k} {_fmt(v) if isinstance(v, float) else v}"
                                               for k, v in data["evaluation"].items()))
    _emit(args, data, "\n".join(lines))
    return EXIT_OK


def _metric_option(args: argparse.Namespace) -> Any:
    """The metric ``--metric`` names (None: the project's); user code only with --trust-code."""
    if not args.metric:
        return None
    from workbench.analysis import get_metric

    # a path typed on the command line is relative to where it was typed
    return get_metric(args.metric, args.metric_direction, trust_code=args.trust_code)


def _cmd_sensitivity(args: argparse.Namespace) -> int:
    from workbench.launcher import job_context

    with job_context() as context:
        session = _open(args)
        metric = _metric_option(args)
        with _Progress(args, "sensitivity", context.is_main) as progress:
            result = session.sensitivity(scheme=args.scheme, metric=metric, num_batches=args.num_batches,
                                         progress=progress, cancel=progress.cancel, context=context)
            fallback = None
            if args.tolerance is not None or args.target is not None:
                fallback = session.fallback(tolerance=args.tolerance, target=args.target, max_units=args.max_units,
                                            metric=metric, apply=args.apply, progress=progress,
                                            cancel=progress.cancel, context=context)
    if not context.is_main:  # rank 0 writes the project and reports for the job
        return EXIT_OK
    session.save()
    data = {"sensitivity": result.to_dict(), "world_size": context.world_size}
    lines = [result.summary()]
    # under SQNR the FP32 model scores +inf, so a delta against it says nothing
    vs_fp32 = math.isfinite(result.fp32)
    for unit in result.ranked()[:args.top]:
        versus = f"vs all quantized {unit.delta_vs_quantized:+.4g}"
        if vs_fp32:
            versus += f", vs FP32 {unit.delta_vs_fp32:+.4g}"
        lines.append(f"  {unit.rank:>3}. {unit.name:<36} {_fmt(unit.value)}  ({versus})")
    if fallback is not None:
        data["fallback"] = fallback.to_dict()
        lines.append(fallback.summary())
        if args.apply:
            lines.append("applied: the chosen layers are left in float in the project")
    _emit(args, data, "\n".join(lines))
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    session = _open(args)
    report = session.export(args.output, opset=args.opset, dynamic_batch=not args.static_batch,
                            amax_json=args.amax_json or None, calibration_cache=args.calibration_cache or None)
    session.save()
    _emit(args, report.to_dict(), report.summary())
    return EXIT_OK


def _cmd_finetune(args: argparse.Namespace) -> int:
    from workbench.training import recipe

    session = _open(args)
    if args.reset:
        reset = session.reset_finetune()
        session.save()
        _emit(args, {"reset": reset}, "back to the calibrated weights" if reset else "no fine-tuned weights in use")
        return EXIT_OK
    if args.train_data:
        typed = _data_spec(args.train_data, args, args.batch_size)  # relative to where it was typed
        session.set_data("training", typed.absolute(Path.cwd()).relative_to(session.base_dir))
    options: dict[str, Any] = {}
    if args.original_lr is not None:
        options.update(recipe(args.original_lr, args.original_epochs))
    elif args.original_epochs is not None:
        raise UsageError("--original-epochs goes with --original-lr (the recipe needs both).")
    given = {"epochs": args.epochs, "lr": args.lr, "optimizer": args.optimizer, "schedule": args.schedule,
             "loss": _typed_entrypoint(args.loss, session), "momentum": args.momentum,
             "weight_decay": args.weight_decay,
             "steps_per_epoch": args.steps_per_epoch, "amp": args.amp, "learn_amax": args.learn_amax}
    options.update({key: value for key, value in given.items() if value is not None})
    metric = _metric_option(args)
    with _Progress(args, "fine-tuning") as progress:
        result = session.finetune(metric=metric, progress=progress, cancel=progress.cancel, **options)
    session.save()
    data = result.to_dict()
    data["summary"] = result.summary()
    lines = [result.summary(), f"  {'epoch':>5} {'train loss':>11} {'eval loss':>10} {'metric':>9} {'lr':>9}"]
    for record in [result.baseline] + result.history:
        best = "  best" if record.epoch == result.best_epoch else ""
        lines.append(f"  {record.epoch:>5} {_fmt(record.train_loss):>11} {_fmt(record.eval_loss):>10} "
                     f"{_fmt(record.metric):>9} {_fmt(record.lr):>9}{best}")
    for name, change in result.learned_amax.items():
        lines.append(f"  learned amax {name}: {change['before']:.4g} -> {change['after']:.4g}")
    for name, reason in result.learn_amax_skipped.items():
        lines.append(f"  amax kept for {name}: {reason}")
    if result.cancelled:
        lines.append("cancelled: the model has the best weights so far" if result.epochs_completed
                     else "cancelled before the first epoch ended: nothing changed")
    _emit(args, data, "\n".join(lines))
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from workbench.demo_run import run_demo

    with _Progress(args, "demo") as progress:
        report = run_demo(Path(args.out), calib_batches=args.calib_batches, method=args.method, progress=progress,
                          cancel=progress.cancel)
    _emit(args, report, report["text"])
    return EXIT_OK


def _cmd_gui(args: argparse.Namespace) -> int:
    try:
        from workbench.app.main import run_gui
    except ImportError as error:
        raise UsageError(f"the desktop app is not available: {error}. Install the GUI extras "
                         "(pip install 'quant-workbench[gui]').") from None
    return run_gui(project=args.project, demo=args.demo, trust_code=args.trust_code)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description="Quant Workbench: INT8 quantization of "
                                     "PyTorch models for TensorRT.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def project_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument("project", help="the project file (.qwb)")
        command.add_argument("--trust-code", action="store_true",
                             help="allow running the project's model/data/metric code (entry points, pickles)")
        command.add_argument("--json", action="store_true", help="print the result as JSON")
        return command

    version = sub.add_parser("version", help="print versions")
    version.set_defaults(func=_cmd_version)

    new = project_command("new", "create a project on a model and data")
    new.add_argument("--model", required=True, help="file.py:factory, package.module:factory, model.pt (a pickled "
                                                    "model) or demo:digits / demo:resnet18 / demo:resnet50")
    new.add_argument("--model-kwargs", help="keyword arguments of the factory: name=value,...")
    new.add_argument("--weights", help="state_dict file (.pt/.pth loaded with weights_only, or .safetensors)")
    new.add_argument("--code-dir", help="folder with the code a pickled model needs (default: its folder)")
    new.add_argument("--data", required=True, help="calibration data: a folder of images, a tensor file "
                                                   "(.npy/.npz/.safetensors/.pt), file.py:function, or demo:digits")
    new.add_argument("--eval-data", help="evaluation data (same forms; default: the calibration data)")
    new.add_argument("--input-shape", help="per-sample input shape to check the data against, e.g. 3,224,224")
    new.add_argument("--batch-size", type=int, default=32)
    new.add_argument("--num-batches", type=int, help="calibration batches to use (default: all)")
    new.add_argument("--shuffle", action="store_true")
    new.add_argument("--seed", type=int, default=0)
    new.add_argument("--resize", type=int, help="images: resize the shorter side to this")
    new.add_argument("--crop", type=int, help="images: center crop to this size")
    new.add_argument("--mean", type=float, nargs="+", help="images: per-channel mean to subtract")
    new.add_argument("--std", type=float, nargs="+", help="images: per-channel std to divide by")
    new.add_argument("--grayscale", action="store_true", help="images: one channel")
    new.add_argument("--metric", help="sqnr, cosine, mse, top1, or module:function / file.py:function")
    new.add_argument("--metric-direction", choices=["higher", "lower"], help="for a user metric")
    new.add_argument("--force", action="store_true", help="overwrite an existing project file")
    new.set_defaults(func=_cmd_new)

    show = project_command("show", "print a project's model, data, layers and results")
    show.set_defaults(func=_cmd_show)

    set_ = project_command("set", "quantize or ignore layers, set descriptors, rules and settings")
    set_.add_argument("--layer", action="append", help="a layer name (repeatable)")
    set_.add_argument("--pattern", action="append", help="layers whose name matches this regex (repeatable)")
    set_.add_argument("--type", action="append", help="layers of this type, e.g. Conv2d (repeatable)")
    set_.add_argument("--subtree", help="every layer under this module, e.g. layer1")
    set_.add_argument("--ignore", action="append", help="leave layers matching this regex in float (repeatable)")
    set_.add_argument("--quantize", action="append", help="quantize layers matching this regex (repeatable)")
    set_.add_argument("--input-desc", help="input descriptor fields for the chosen layers: num_bits=8,calib_method="
                                           "histogram,unsigned=true,narrow_range=false,axis=none")
    set_.add_argument("--weight-desc", help="weight descriptor fields for the chosen layers, e.g. num_bits=4,axis=0")
    set_.add_argument("--reset", action="store_true", help="back to default descriptors for the chosen layers")
    set_.add_argument("--rule", action="append", help="placement rule on/off: concat=false, maxpool=true, residual=")
    set_.add_argument("--pin", action="append", help="share one quantizer between two: NAME1,NAME2 (repeatable)")
    set_.add_argument("--metric", help="the project's metric: sqnr, cosine, mse, top1, or an entry point")
    set_.add_argument("--metric-direction", choices=["higher", "lower"])
    set_.add_argument("--device", help="cpu, cuda, cuda:1 ...")
    set_.add_argument("--fold-bn", choices=["on", "off"],
                      help="fold BatchNorm into the layer before it (as TensorRT does); on by default")
    set_.set_defaults(func=_cmd_set)

    cal = project_command("calibrate", "calibrate on the project's calibration data")
    cal.add_argument("--method", choices=["entropy", "mse", "percentile", "max"],
                     help="amax method of histogram quantizers (default: the project's, entropy)")
    cal.add_argument("--num-batches", type=int)
    cal.add_argument("--percentile", type=float)
    cal.add_argument("--evaluate", action="store_true", help="then compare FP32 and INT8 on the evaluation data")
    _workers_option(cal)
    cal.set_defaults(func=_cmd_calibrate)

    sens = project_command("sensitivity", "rank layers by sensitivity; optionally search a fallback set")
    sens.add_argument("--scheme", choices=["one-off", "one-on"], default="one-off")
    sens.add_argument("--metric", help="override the project's metric")
    sens.add_argument("--metric-direction", choices=["higher", "lower"])
    sens.add_argument("--num-batches", type=int, help="evaluation batches to use")
    sens.add_argument("--top", type=int, default=10, help="how many layers to print")
    sens.add_argument("--tolerance", type=float, help="fallback search: get within this of FP32")
    sens.add_argument("--target", type=float, help="fallback search: reach this metric value instead")
    sens.add_argument("--max-units", type=int, help="fallback search: at most this many layers in float")
    sens.add_argument("--apply", action="store_true", help="leave the fallback's layers in float in the project")
    _workers_option(sens)
    sens.set_defaults(func=_cmd_sensitivity)

    export = project_command("export", "write validated QDQ ONNX")
    export.add_argument("-o", "--output", help="the .onnx file (default: next to the project)")
    export.add_argument("--opset", type=int)
    export.add_argument("--static-batch", action="store_true", help="keep the sample's batch size fixed")
    export.add_argument("--amax-json", action="store_true", help="also write the amax table as JSON")
    export.add_argument("--calibration-cache", action="store_true",
                        help="also write a TensorRT calibration cache (implicit quantization)")
    export.set_defaults(func=_cmd_export)

    tune = project_command("finetune", "quantization-aware fine-tuning of the calibrated model (amax fixed)")
    tune.add_argument("--epochs", type=int, help="passes over the training data (recipe: ~10%% of the original)")
    tune.add_argument("--lr", type=float, help="starting learning rate (recipe: 1%% of the original)")
    tune.add_argument("--original-lr", type=float, help="derive --lr (and --epochs with --original-epochs) from "
                                                        "the original training by the reference recipe")
    tune.add_argument("--original-epochs", type=int, help="the original training's epochs")
    tune.add_argument("--optimizer", choices=["sgd", "adam"])
    tune.add_argument("--schedule", choices=["cosine", "constant"],
                      help="cosine: anneal to 1%% of --lr by the last step (default)")
    tune.add_argument("--momentum", type=float, help="SGD momentum (default 0.9)")
    tune.add_argument("--weight-decay", type=float)
    tune.add_argument("--steps-per-epoch", type=int, help="stop each epoch after this many batches")
    tune.add_argument("--loss", help="cross_entropy (default, needs labels) or a function fn(outputs, targets) "
                                     "as module:function or file.py:function (needs --trust-code)")
    tune.add_argument("--learn-amax", action="append", metavar="PATTERN",
                      help="learn the amax of quantizers matching this regex (per-tensor only; repeatable); "
                           "default: as the project's last fine-tune, at first fixed; '' for fixed")
    tune.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                      help="mixed precision (default: on with CUDA)")
    tune.add_argument("--metric", help="what picks the best epoch (default: the project's metric)")
    tune.add_argument("--metric-direction", choices=["higher", "lower"])
    tune.add_argument("--train-data", help="data to train on, stored in the project (same forms as --data of "
                                           "'new'; default: all of the calibration data)")
    tune.add_argument("--batch-size", type=int, default=32, help="for --train-data")
    tune.add_argument("--num-batches", type=int, help="for --train-data: batches per pass (default: all)")
    tune.add_argument("--shuffle", action="store_true", help="for --train-data")
    tune.add_argument("--seed", type=int, default=0, help="for --train-data")
    tune.add_argument("--resize", type=int, help="for --train-data images")
    tune.add_argument("--crop", type=int, help="for --train-data images")
    tune.add_argument("--mean", type=float, nargs="+", help="for --train-data images")
    tune.add_argument("--std", type=float, nargs="+", help="for --train-data images")
    tune.add_argument("--grayscale", action="store_true", help="for --train-data images")
    tune.add_argument("--reset", action="store_true", help="drop the fine-tuned weights: back to the calibrated "
                                                           "model's own")
    tune.set_defaults(func=_cmd_finetune)

    demo = sub.add_parser("demo", help="the whole job on the built-in digits CNN, without a screen")
    demo.add_argument("--out", default="workbench-demo", help="folder for the project and ONNX (default: "
                                                              "./workbench-demo)")
    demo.add_argument("--method", choices=["entropy", "mse", "percentile", "max"], default="mse")
    demo.add_argument("--calib-batches", type=int, default=8)
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(func=_cmd_demo)

    gui = sub.add_parser("gui", help="open the desktop app")
    gui.add_argument("project", nargs="?", help="a project to open")
    gui.add_argument("--demo", action="store_true", help="open the demo project, ready to calibrate")
    gui.add_argument("--trust-code", action="store_true")
    gui.set_defaults(func=_cmd_gui)
    return parser


def _workers_option(command: argparse.ArgumentParser) -> None:
    command.set_defaults(distributed=True)
    command.add_argument("--workers", type=int, metavar="N",
                         help="run in N local processes (PyTorch's elastic launcher; one per GPU when there are "
                              "N GPUs), with the same result as one process; under torchrun, torchrun decides")


def _launch_workers(args: argparse.Namespace, argv: list[str]) -> int:
    """``--workers N``: the same command in N processes; rank 0 prints the result and writes the project."""
    from workbench.launcher import WorkerFailed, launch

    if args.workers < 1:
        print(f"workbench: error: --workers must be at least 1, got {args.workers}.", file=sys.stderr)
        return EXIT_USAGE
    try:
        return launch(_worker_main, (argv,), nprocs=args.workers)
    except WorkerFailed as error:
        print(f"workbench: error: {error} The project was not changed.", file=sys.stderr)
        return EXIT_INTERNAL


def _worker_main(argv: list[str]) -> int:
    """One process of ``--workers N``: the command as usual, but a failure is raised, so that the launcher
    stops the other workers and reports this rank's error."""
    from workbench.launcher import WorkerError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(message)s")
    code, message = _run(args)
    if code != EXIT_OK:
        raise WorkerError((message or f"exit code {code}").removeprefix("error: "))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse already printed the usage line
        return EXIT_USAGE if exit_.code else EXIT_OK
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(message)s")
    from workbench.quant.distributed import launched_by_torchrun

    if launched_by_torchrun() and not getattr(args, "distributed", False):
        # every rank would run it and write the same files
        print(f"workbench: error: only calibrate and sensitivity run in several processes; run {args.command} "
              "without torchrun.", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "workers", None) not in (None, 1) and not launched_by_torchrun():
        return _launch_workers(args, [str(a) for a in argv])
    code, message = _run(args)
    if message:
        rank = f"rank {os.environ.get('RANK')}: " if launched_by_torchrun() else ""
        print(f"workbench: {rank}{message}", file=sys.stderr)
    return code


def _run(args: argparse.Namespace) -> tuple[int, str | None]:
    """Run the command; its exit code and, on failure, the one line to show (tracebacks only with --debug)."""
    from workbench.project import ProjectError
    from workbench.session import SessionError
    from workbench.sources.errors import SourceError

    user_errors: tuple[type[BaseException], ...] = (UsageError, ProjectError, SessionError, SourceError,
                                                    ValueError, TypeError, FileNotFoundError)
    try:
        from workbench.analysis import AnalysisCancelled, AnalysisError, MetricError
        from workbench.export import ExportError
        from workbench.quant.calibrate import CalibrationCancelled, CalibrationError
        from workbench.training import FinetuneError

        user_errors += (ExportError, AnalysisError, MetricError, CalibrationError, FinetuneError)
        cancelled: tuple[type[BaseException], ...] = (CalibrationCancelled, AnalysisCancelled)
    except ImportError:  # pragma: no cover - optional parts missing
        cancelled = ()
    try:
        return args.func(args), None
    except cancelled as error:
        return EXIT_INTERNAL, f"cancelled: {error}"
    except user_errors as error:
        if args.debug:
            raise
        return EXIT_USAGE, f"error: {error}"
    except KeyboardInterrupt:
        return EXIT_INTERNAL, "interrupted"
    except BrokenPipeError:  # output piped into `head` and friends: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK, None
    except Exception as error:  # noqa: BLE001 - last resort: one line, not a traceback
        if args.debug:
            raise
        return EXIT_INTERNAL, f"internal error: {type(error).__name__}: {error} (run with --debug for details)"

if __name__ == "__main__":
    sys.exit(main())
