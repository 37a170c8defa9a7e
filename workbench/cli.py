"""The ``workbench`` command line: the headless twin of the GUI, over :mod:`workbench.session`.

Exit codes: 0 success, 2 bad input or usage (one clear line on stderr), 1 internal error, 3 a fallback
search that ran but did not reach its goal. Tracebacks
only with ``--debug``. ``--json`` prints machine-readable results on stdout.
"""
from __future__ import annotations

import argparse
import contextlib
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
EXIT_NOT_REACHED = 3  # a search ran and was saved, but did not reach its goal (sensitivity --target/--tolerance)


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


# ----- helpers -----------------------------------------------------------------------------------


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
    from workbench.sources.errors import TrustRequired

    try:
        return Session.open(args.project, trust_code=args.trust_code, remembered=not args.no_trust)
    except TrustRequired as error:
        raise TrustRequired(f"{error} To trust it once and for later commands: workbench trust {args.project} "
                            f"(or --trust-code); 'workbench show {args.project}' says what it runs.") from None


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    # with --json, stdout is the JSON alone: user code printed to stderr meanwhile (see main)
    out = getattr(args, "stdout", None) or sys.stdout
    if getattr(args, "json", False):
        from workbench.strict_json import dumps

        print(dumps(data, indent=2), file=out)  # strict: NaN/Inf as text, never a bare NaN
    else:
        print(text, file=out)


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
    from workbench.session.new_project import image_options
    from workbench.sources.data_source import DataSpec

    spec = DataSpec.parse(text, batch_size=batch_size, num_batches=args.num_batches, shuffle=args.shuffle,
                          seed=args.seed)
    given = [f"--{name}" for name in ("resize", "crop", "mean", "std") if getattr(args, name) is not None]
    given += ["--grayscale"] if args.grayscale else []
    if given and spec.kind != "images":  # said, not silently dropped: tensors are used as they are
        print(f"workbench: note: {', '.join(given)} apply to folders of images; {text} is {spec.kind} data, used "
              "as it is: ignored", file=sys.stderr)
    elif given:
        spec.image = image_options(resize=args.resize, crop=args.crop, mean=args.mean, std=args.std,
                                   grayscale=args.grayscale)
    return spec


def _typed_entrypoint(spec: str | None, session: Any) -> str | None:
    """A ``file.py:function`` typed on the command line names a file relative to where it was typed; the
    project keeps it relative to its own folder (which may be elsewhere)."""
    from workbench.sources.paths import absolute_entrypoint, relative_entrypoint

    return None if spec is None else relative_entrypoint(absolute_entrypoint(spec, Path.cwd()), session.base_dir)


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
    calibration = _data_spec(args.data, args, args.batch_size)
    evaluation = _data_spec(args.eval_data, args, args.batch_size) if args.eval_data else None
    if evaluation is not None:
        evaluation.num_batches = None
    settings = new_project_settings(metric=args.metric, direction=args.metric_direction)
    if args.output_key:
        settings["output"] = args.output_key
    if args.num_batches is not None:  # what the help says: calibration uses this many, not the default
        from workbench.project.settings import DEFAULT_SETTINGS

        settings["calibration"] = {**DEFAULT_SETTINGS["calibration"], "num_batches": args.num_batches}
    session = Session.create(model, calibration, evaluation, trust_code=args.trust_code,
                             input_shape=InputSpec.parse_shape(args.input_shape), name=project.stem,
                             base_dir=Path.cwd(), settings=settings)
    path = session.save(project)
    summary = session.summary()
    _emit(args, summary, f"Created {path}: {summary['model_description']}, input {summary['input']}, "
                         f"{summary['layers']} quantizable layers.")
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from workbench.sources.errors import TrustRequired

    try:
        session = _open(args)
    except TrustRequired:
        from workbench.cli_trust import untrusted_summary

        data, text = untrusted_summary(args)
        _emit(args, data, text)
        return EXIT_OK
    layers = session.layers()  # the summary counts them too: listed once
    summary = session.summary(layers)
    summary["layer_table"] = [layer.__dict__ for layer in layers]
    lines = [f"{summary['name']} ({summary['path']})", f"  model: {summary['model_description']}",
             f"  input: {summary['input']}", "  data: " + ", ".join(f"{k} {v}" for k, v in summary["data"].items())]
    run = summary["calibration"]
    if run is None:
        lines.append("  calibration: none yet")
    else:
        shared = run["quantizer_names"] - run["quantizers"]
        counted = f"{run['quantizers']} quantizers" + (f" ({run['quantizer_names']} names: {shared} shared by a rule)"
                                                         if shared else "")
        stale = run["output_sqnr_stale"]
        lines.append(f"  calibration: {run['method']} on {run['batches']} batches, {counted}, output SQNR "
                     f"{_fmt(run['output_sqnr_db'], ' dB')}" + (f" (stale: {'; '.join(stale)}; recalibrate "
                                                                  "for a current figure)" if stale else ""))
    settings = summary["settings"]
    calibration = settings["calibration"]
    lines.append(f"  settings: calibration {calibration['method']} on {calibration['num_batches'] or 'all'} batches "
                 f"(percentile {calibration['percentile']}%), metric {settings['metric']['name']}; placement rules "
                 + ", ".join(f"{name} {'on' if on else 'off'}" for name, on in settings["rules"].items()))
    lines.extend(_folding_lines(summary["folding"]))
    lines.extend(_functional_lines(summary["functional"]))
    tuned = summary["finetune"]
    if tuned is not None:
        lines.append(f"  fine-tune: run {tuned['id']}: {tuned['summary']}")
        if tuned["status"] and "in use" not in tuned["status"]:
            lines.append(f"  warning: {tuned['status']}")
    for message in summary["file_changes"] + [f"recalibrate: {n}" for n in summary["stale_quantizers"][:5]]:
        lines.append(f"  warning: {message}")
    lines.append(f"  layers: {summary['quantized_layers']} of {summary['layers']} quantized")
    lines += [f"    {item['name']} ({item['type']}): {item['reason']}" for item in summary["not_quantizable"]]
    lines.append(f"    {'layer':<32} {'type':<20} {'input':<28} {'weight':<24} {'amax':<22} rank")
    for layer in layers:
        notes = f"  ({', '.join(layer.notes)})" if getattr(layer, "notes", None) else ""
        lines.append(f"    {layer.name:<32} {layer.display_type:<20} {layer.input_summary:<28} {layer.weight_summary:<24} "
                     f"{layer.amax_summary:<22} {layer.sensitivity_rank or '-'}{notes}")
    _emit(args, summary, "\n".join(lines))
    return EXIT_OK


def _functional_lines(functional: dict[str, Any]) -> list[str]:
    """``workbench show``: functional quantizers, attention left in float (and why), untraced modules."""
    lines = [f"  functional: {functional['adds']} adds, {functional['concats']} concatenations, "
             f"{functional['matmuls']} matrix products, {functional['attentions']} attentions quantized; "
             f"{functional['left_float']} operations left in float"]
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
        changed.setdefault("rules", []).append(f"{name}={session.project.settings['rules'][name]}")
    for pin in args.pin or []:
        first, _, second = pin.partition(",")
        if not second:
            raise UsageError(f"--pin takes two quantizer or layer names separated by a comma, got {pin!r}.")
        session.add_pins([(first.strip(), second.strip())])
        changed.setdefault("pins", []).append(pin)
    if args.metric:
        session.set_setting("metric", {"name": _typed_entrypoint(args.metric, session),
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
        functional = dict(session.project.settings["functional"])
        if name not in FUNCTIONAL_SWITCHES:
            raise UsageError(f"unknown functional switch {name!r}; switches are {', '.join(FUNCTIONAL_SWITCHES)}.")
        if value not in ("on", "off", "true", "false"):
            raise UsageError(f"--functional {name} takes on or off, got {value!r}.")
        functional[name] = value in ("on", "true")
        session.set_setting("functional", functional)
        changed.setdefault("functional", []).append(f"{name}={'on' if functional[name] else 'off'}")
    if args.output_key is not None:
        session.set_setting("output", args.output_key or None)
        changed["output"] = [args.output_key or "first tensor"]
    for role, text in (("calibration", args.data), ("evaluation", args.eval_data)):
        if text:  # checked as `new` checks it: the inputs must fit the model
            batch_size = args.batch_size or (session.project.data[role].batch_size if role in session.project.data
                                              else session.project.data["calibration"].batch_size)
            typed = _data_spec(text, args, batch_size)  # relative to where it was typed
            if role == "evaluation":
                typed.num_batches = None
            session.set_data(role, typed.absolute(Path.cwd()).relative_to(session.base_dir))
            changed[f"{role} data"] = [session.project.data[role].label]
    if args.data and args.num_batches is not None:
        session.set_setting("calibration", {**session.project.settings["calibration"], "num_batches": args.num_batches})
    if args.fold_bn is not None:
        session.set_setting("fold_bn", args.fold_bn == "on")
        folded = session.folded_layers()
        changed["fold_bn"] = [f"{bn} -> {layer}" for layer, bn in folded.items()] if folded else [args.fold_bn]
        if session.build_report.stale:
            changed["recalibrate"] = list(session.build_report.stale)
    if not changed:
        raise UsageError("nothing to change: see 'workbench set --help'.")
    session.save()
    text = "\n".join([f"{what}: {', '.join(names) if names else 'no change'}" for what, names in changed.items()]
                     + [f"note: {note}" for note in notes])
    _emit(args, {**changed, "notes": notes} if notes else changed, text)
    return EXIT_OK


class _HeldWarnings(logging.Filter):
    """Holds back the library's logged warnings while a job runs, so that the command prints each one once,
    with its result (a calibration logs its warnings and returns them too)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.name.startswith("workbench"):
            self.messages.append(record.getMessage())
            return False
        return True

    def __enter__(self) -> _HeldWarnings:
        for handler in logging.getLogger().handlers:
            handler.addFilter(self)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self)
        if exc_type is not None:  # the job failed: what it warned about before still reaches the user
            for message in dict.fromkeys(self.messages):
                print(f"workbench: warning: {message}", file=sys.stderr)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from workbench.launcher import job_context
    from workbench.project.settings import percentile_mistake

    mistake = None if args.percentile is None or args.force else percentile_mistake(args.percentile)
    if mistake:
        raise UsageError(f"{mistake} (--force calibrates with {args.percentile:g} anyway)")
    with job_context() as context:
        session = _open(args)
        with _Progress(args, "calibrating", context.is_main) as progress, _HeldWarnings() as held:
            result = session.calibrate(method=args.method, num_batches=args.num_batches,
                                       percentile=args.percentile, progress=progress, cancel=progress.cancel,
                                       context=context)
    if not context.is_main:  # rank 0 writes the project and reports for the job
        return EXIT_OK
    result.warnings = list(dict.fromkeys(result.warnings + held.messages))  # each once
    session.save()
    data = {"summary": result.summary(), "method": result.method, "batches": result.num_batches,
            "world_size": context.world_size,
            "output_sqnr_db": result.output_sqnr_db, "warnings": result.warnings, "unused": result.unused,
            "quantizers": {n: {"amax": q.amax.tolist(), "method": q.method, "samples": q.num_samples,
                               "nonfinite": q.nonfinite_count} for n, q in result.quantizers.items()}}
    failed = None
    if args.evaluate:
        try:
            evaluation = session.evaluate()
            data["evaluation"] = evaluation.to_dict()
        except Exception as error:  # noqa: BLE001 - the calibration is saved: say so, whatever went wrong
            if args.debug:
                raise
            failed = error
            data["evaluation"] = None
            data["evaluation_error"] = f"{type(error).__name__}: {error}"
    lines = [result.summary()] + [f"warning: {w}" for w in result.warnings]
    if args.evaluate and failed is None:
        lines.append(f"evaluation: {evaluation.summary()}")
    _emit(args, data, "\n".join(lines))
    if failed is not None:
        print(f"workbench: error: the calibration was saved to {session.path}, but the evaluation failed and was "
              f"not done: {data['evaluation_error']}", file=sys.stderr)
        return EXIT_USAGE if isinstance(failed, (ValueError, LookupError, OSError)) else EXIT_INTERNAL
    return EXIT_OK


def _metric_option(args: argparse.Namespace) -> Any:
    """The metric ``--metric`` names (None: the project's); user code only with --trust-code."""
    if not args.metric:
        return None
    from workbench.analysis import get_metric

    # a path typed on the command line is relative to where it was typed
    return get_metric(args.metric, args.metric_direction, trust_code=args.trust_code)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    session = _open(args)
    metric = _metric_option(args)
    with _Progress(args, "evaluating") as progress:
        evaluation = session.evaluate(metric, num_batches=args.num_batches, progress=progress,
                                      cancel=progress.cancel)
    lines = [f"  {'':<22} {'FP32':>10} {'INT8':>10} {'delta':>10}",
             f"  {evaluation.name:<22} {_fmt(evaluation.fp32):>10} {_fmt(evaluation.int8):>10} "
             f"{_fmt(evaluation.delta):>10}   ({evaluation.metric.get('direction')} is better)",
             f"  output SQNR INT8 vs FP32: {_fmt(evaluation.output_sqnr_db, ' dB')} ({evaluation.num_batches} batches)"]
    _emit(args, evaluation.to_dict(), "\n".join(lines))
    return EXIT_OK


def _cmd_sensitivity(args: argparse.Namespace) -> int:
    from workbench.launcher import job_context

    with job_context() as context:
        session = _open(args)
        metric = _metric_option(args)
        with _Progress(args, "sensitivity", context.is_main) as progress:
            result = session.sensitivity(scheme=args.scheme, metric=metric, num_batches=args.num_batches,
                                         units=None if args.units == "layers" else args.units,
                                         progress=progress, cancel=progress.cancel, context=context)
            fallback = None
            tolerance, target, goal_note = args.tolerance, args.target, None
            if tolerance is not None and target is None and not math.isfinite(result.fp32):
                # no gap to an infinite FP32 value (SQNR) can close: the tolerance counts from the INT8 start
                target = result.quantized + (tolerance if result.higher_is_better else -tolerance)
                goal_note = (f"FP32 {result.metric_name} is {result.fp32}: --tolerance {tolerance:g} counts from "
                             f"the all-INT8 value {result.quantized:.4g}, so the target is {target:.4g}")
                tolerance = None
            if tolerance is not None or target is not None:
                fallback = session.fallback(tolerance=tolerance, target=target, max_units=args.max_units,
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
        if goal_note:
            data["fallback"]["goal_note"] = goal_note
            lines.append(goal_note)
        lines.append(fallback.summary())
        if args.apply:
            lines.append("applied: the chosen layers are left in float in the project")
    _emit(args, data, "\n".join(lines))
    if fallback is not None and not fallback.reached:  # scripts can tell: the ranking and the curve are saved
        print(f"workbench: the fallback search did not reach its goal (exit {EXIT_NOT_REACHED}); "
              "the ranking and the search are saved in the project", file=sys.stderr)
        return EXIT_NOT_REACHED
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    session = _open(args)
    folder = Path(args.output).parent if args.output else None
    made = folder is not None and not folder.exists()
    if made:  # `-o out/x.onnx` into a folder that is not there yet: make it (and take it back if nothing lands)
        folder.mkdir(parents=True)
    try:
        report = session.export(args.output, opset=args.opset, dynamic_batch=not args.static_batch,
                                amax_json=args.amax_json or None, calibration_cache=args.calibration_cache or None,
                                force=args.force)
    except BaseException:
        if made and not any(folder.iterdir()):
            folder.rmdir()
        raise
    session.save()
    written = [report.path] + [path for path in (report.amax_json_path, report.calibration_cache_path,
                                                 report.float_onnx_path) if path]
    _emit(args, {**report.to_dict(), "files": written},
          report.summary() + "\nwrote: " + ", ".join(written))
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


def _no_display_message(project: str | None) -> str | None:
    """Why a window cannot open here and how to get one; None when it can (or when that cannot be told)."""
    import os

    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    command = "workbench gui" + (f" {project}" if project else "")
    return (f"no display to open a window on (neither DISPLAY nor WAYLAND_DISPLAY is set). Run it on a desktop, "
            f"under a virtual display ('xvfb-run -a {command}'), or with QT_QPA_PLATFORM=offscreen for a window "
            "nobody sees (screenshots, tests); the same work runs headless with the other commands.")


def _cmd_gui(args: argparse.Namespace) -> int:
    no_display = _no_display_message(args.project)
    if no_display:  # checked first: Qt itself aborts the process (exit 134) with a text about plugins
        raise UsageError(no_display)
    try:
        from workbench.app.main import run_gui
    except ImportError as error:
        raise UsageError(f"the desktop app is not available: {error}. Install the GUI extras "
                         "(pip install 'quant-workbench[gui]').") from None
    return run_gui(project=args.project, demo=args.demo, trust_code=args.trust_code)


def _data_options(command: argparse.ArgumentParser, default_batches: int, *, required: bool) -> None:
    """The data options of ``new`` and of ``set`` (which changes a project's data with the same checks)."""
    command.add_argument("--data", required=required, help="calibration data: a folder of images, a folder of "
                         ".npy files, a tensor file (.npy/.npz/.safetensors/.pt), file.py:function, or demo:digits")
    command.add_argument("--eval-data", help="evaluation data (same forms; default: the calibration data)")
    command.add_argument("--batch-size", type=int, default=32 if required else None,
                         help="samples per batch (default: 32" + ("" if required else "; set: as the data had") + ")")
    command.add_argument("--num-batches", type=int, help=f"calibration batches to use (default: {default_batches}, "
                                                          "or all the data has if fewer)")
    command.add_argument("--shuffle", action="store_true")
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--resize", type=int, help="images: resize the shorter side to this")
    command.add_argument("--crop", type=int, help="images: center crop to this size")
    command.add_argument("--mean", type=float, nargs="+", help="images: per-channel mean to subtract")
    command.add_argument("--std", type=float, nargs="+", help="images: per-channel std to divide by")
    command.add_argument("--grayscale", action="store_true", help="images: one channel")


def build_parser() -> argparse.ArgumentParser:
    from workbench.analysis.metrics import DIRECTIONS, metric_choices_text
    from workbench.analysis.results import SCHEMES
    from workbench.quant.calib.methods import AMAX_METHODS, DEFAULT_AMAX_METHOD, PERCENTILE, AmaxMethod
    from workbench.analysis.units import UNIT_SCHEMES
    from workbench.project.settings import FUNCTIONAL_SWITCHES  # the one definition of the switches

    from workbench.project.settings import DEFAULT_SETTINGS

    # every default a help text names is read from the project settings' defaults: one source of truth
    calib_defaults, tune_defaults = DEFAULT_SETTINGS["calibration"], DEFAULT_SETTINGS["finetune"]
    default_metric = DEFAULT_SETTINGS["metric"]["name"]
    parser = argparse.ArgumentParser(prog="workbench", description="Quant Workbench: INT8 quantization of "
                                     "PyTorch models for TensorRT.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def project_command(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument("project", help="the project file (.qwb)")
        command.add_argument("--trust-code", action="store_true",
                             help="allow running the project's model/data/metric code (entry points, pickles), "
                                  "and remember it for this project until that code changes")
        command.add_argument("--no-trust", action="store_true",
                             help="ignore the trust remembered for this project (its code does not run)")
        command.add_argument("--json", action="store_true", help="print the result as JSON")
        return command

    version = sub.add_parser("version", help="print versions")
    version.set_defaults(func=_cmd_version)

    new = project_command("new", "create a project on a model and data")
    new.add_argument("--model", required=True, help="file.py:factory, package.module:factory, model.pt (a pickled "
                                                    "model), demo:digits / demo:resnet18 / demo:resnet50, hf:DIR (a "
                                                    "local Hugging Face folder) or timm:NAME[@weights.safetensors]")
    new.add_argument("--model-kwargs", help="keyword arguments of the factory: name=value,... or a YAML/JSON "
                                            "mapping ('num_classes: 10, pretrained: false')")
    new.add_argument("--weights", help="state_dict file (.pt/.pth loaded with weights_only, or .safetensors)")
    new.add_argument("--code-dir", help="folder with the code a pickled model needs (default: its folder)")
    new.add_argument("--input-shape", help="per-sample input shape to check the data against, e.g. 3,224,224 "
                                           "(optional: the data gives it)")
    _data_options(new, calib_defaults["num_batches"], required=True)
    new.add_argument("--output-key", help="the model output entry that metrics, sensitivity and export compare: a "
                                          "dict/ModelOutput key such as logits, or a tuple index (default: the first "
                                          "tensor)")
    new.add_argument("--metric", help=f"{metric_choices_text()} (default: {default_metric})")
    new.add_argument("--metric-direction", choices=DIRECTIONS, help="for a user metric")
    new.add_argument("--force", action="store_true", help="overwrite an existing project file")
    new.set_defaults(func=_cmd_new)

    show = project_command("show", "print a project's model, data, layers and results (untrusted: the code it "
                                   "would run)")
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
    set_.add_argument("--rule", action="append", metavar="RULE=true|false",
                      help="switch a TensorRT placement rule on or off (repeatable): "
                           + ", ".join(DEFAULT_SETTINGS["rules"]) + " (all on by default), e.g. --rule concat=false; "
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
    _data_options(set_, calib_defaults["num_batches"], required=False)
    set_.add_argument("--fold-bn", choices=["on", "off"],
                      help="fold BatchNorm into the layer before it (as TensorRT does); on by default")
    set_.set_defaults(func=_cmd_set)

    cal = project_command("calibrate", "calibrate on the project's calibration data")
    cal.add_argument("--method", choices=AMAX_METHODS,
                     help=f"amax method of histogram quantizers (default: the project's; new projects: "
                          f"{DEFAULT_AMAX_METHOD}): {AmaxMethod.help_text()}")
    cal.add_argument("--num-batches", type=int, help="calibration batches to use (default: the project's; new "
                                                     f"projects: {calib_defaults['num_batches']})")
    cal.add_argument("--percentile", type=float,
                     help=f"for --method percentile: {PERCENTILE.help.replace('%', '%%')}, {PERCENTILE.describe()}, e.g. "
                          f"99.9 (default: the project's; new projects: {PERCENTILE.default:g})")
    cal.add_argument("--force", action="store_true", help="use a --percentile under 50 (almost always a fraction "
                                                          "typed for a percent: 0.999 for 99.9)")
    cal.add_argument("--evaluate", action="store_true", help="then compare FP32 and INT8 on the evaluation data")
    _workers_option(cal)
    cal.set_defaults(func=_cmd_calibrate)

    evaluate = project_command("evaluate", "a metric on the FP32 and the INT8 model, and the output SQNR")
    evaluate.add_argument("--metric", help=f"{metric_choices_text()} (default: the project's metric)")
    evaluate.add_argument("--metric-direction", choices=DIRECTIONS, help="for a user metric")
    evaluate.add_argument("--num-batches", type=int, help="evaluation batches to use (default: all)")
    evaluate.set_defaults(func=_cmd_evaluate)

    sens = project_command("sensitivity", "rank layers by sensitivity; optionally search a fallback set")
    sens.add_argument("--scheme", choices=SCHEMES, default=SCHEMES[0])
    sens.add_argument("--units", choices=UNIT_SCHEMES, default="layers",
                      help="what is switched together: each quantized layer (an attention's products together), "
                           "or each transformer block (a readable ranking of a 12-layer ViT)")
    sens.add_argument("--metric", help=f"override the project's metric (new projects: {default_metric})")
    sens.add_argument("--metric-direction", choices=DIRECTIONS)
    sens.add_argument("--num-batches", type=int, help="evaluation batches to use")
    sens.add_argument("--top", type=int, default=10, help="how many layers to print")
    sens.add_argument("--tolerance", type=float, help="fallback search: get within this of FP32 (for SQNR, whose "
                                                      "FP32 value is infinite: this many dB above all-INT8)")
    sens.add_argument("--target", type=float, help="fallback search: reach this metric value instead")
    sens.add_argument("--max-units", type=int, help="fallback search: at most this many layers in float")
    sens.add_argument("--apply", action="store_true", help="leave the fallback's layers in float in the project")
    _workers_option(sens)
    sens.set_defaults(func=_cmd_sensitivity)

    export = project_command("export", "write validated QDQ ONNX")
    export.add_argument("-o", "--output", help="the .onnx file (default: next to the project)")
    export.add_argument("--opset", type=int)
    export.add_argument("--static-batch", action="store_true", help="keep the sample's batch size fixed")
    export.add_argument("--force", action="store_true",
                        help="overwrite the .onnx file even if this project did not write it (or it changed since)")
    export.add_argument("--amax-json", action="store_true", help="also write the amax table as JSON")
    export.add_argument("--calibration-cache", action="store_true",
                        help="also write a TensorRT calibration cache (implicit quantization)")
    export.set_defaults(func=_cmd_export)

    tune = project_command("finetune", "quantization-aware fine-tuning of the calibrated model (amax fixed)")
    tune.add_argument("--epochs", type=int, help="passes over the training data (recipe: ~10%% of the original; "
                                                 f"default: {tune_defaults['epochs']})")
    tune.add_argument("--lr", type=float, help="starting learning rate (recipe: 1%% of the original; default: "
                                               f"{tune_defaults['lr']})")
    tune.add_argument("--original-lr", type=float, help="derive --lr (and --epochs with --original-epochs) from "
                                                        "the original training by the reference recipe")
    tune.add_argument("--original-epochs", type=int, help="the original training's epochs")
    tune.add_argument("--optimizer", choices=["sgd", "adam"])
    tune.add_argument("--schedule", choices=["cosine", "constant"],
                      help="cosine: anneal to 1%% of --lr by the last step (default)")
    tune.add_argument("--momentum", type=float, help=f"SGD momentum (default: {tune_defaults['momentum']})")
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
    tune.add_argument("--metric-direction", choices=DIRECTIONS)
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

    from workbench.cli_engine import add_commands  # lint, engine-report, diff
    from workbench.cli_trust import add_commands as add_trust_commands  # trust, untrust

    add_commands(sub, project_command)
    add_trust_commands(sub)

    demo = sub.add_parser("demo", help="the whole job on the built-in digits CNN, without a screen")
    demo.add_argument("--out", default="workbench-demo", help="folder for the project and ONNX (default: "
                                                              "./workbench-demo)")
    demo.add_argument("--method", choices=AMAX_METHODS, default=AmaxMethod.MSE.value)
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
        if not getattr(args, "json", False):
            return args.func(args), None
        args.stdout = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):  # a print in the user's model must not corrupt the JSON
            return args.func(args), None
    except SystemExit as exit_:  # user code (a model class, a metric) that ended the program: not a success
        if args.debug:
            raise
        return EXIT_USAGE, (f"error: user code called sys.exit({exit_.code!r}) during '{args.command}'; nothing "
                            "was saved.")
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
