"""The CLI commands that run the project's jobs: ``calibrate``, ``evaluate``, ``sensitivity`` (and its
fallback search), ``export`` and ``finetune``, with the ``--workers`` option of the distributed ones.

Listed in :data:`COMMANDS` for :func:`workbench.cli.build_parser`, like :mod:`workbench.cli.engine`; they use
the helpers of :mod:`workbench.cli.common`, so errors, ``--json``, progress bars, Ctrl-C and exit codes behave
as for every other command.
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Any

from workbench.cli.common import (
    EXIT_INTERNAL,
    EXIT_NOT_REACHED,
    EXIT_NOT_VALIDATED,
    EXIT_OK,
    EXIT_USAGE,
    Command,
    Progress,
    UsageError,
    data_spec,
    emit,
    fmt,
    open_project,
    typed_entrypoint,
)

__all__ = ["COMMANDS"]


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
    from workbench.quant.calib.methods import percentile_mistake

    mistake = None if args.percentile is None or args.force else percentile_mistake(args.percentile)
    if mistake:
        raise UsageError(f"{mistake} (--force calibrates with {args.percentile:g} anyway)")
    with job_context() as context:
        session = open_project(args)
        with Progress(args, "calibrating", context.is_main) as progress, _HeldWarnings() as held:
            result = session.calibrate(method=args.method, num_batches=args.num_batches,
                                       percentile=args.percentile, progress=progress, cancel=progress.cancel,
                                       context=context, block_method=args.block_method,
                                       smoothquant=args.smoothquant,
                                       awq=None if args.awq is None else args.awq == "on",
                                       sequential=None if args.sequential is None else args.sequential == "on")
    if not context.is_main:  # rank 0 writes the project and reports for the job
        return EXIT_OK
    result.warnings = list(dict.fromkeys(result.warnings + held.messages))  # each once
    session.save()
    smoothed = {name: {"method": r.method, "alpha": r.alpha, "folded_into": r.folded_into,
                       "scales_min": float(r.scales.min()), "scales_max": float(r.scales.max())}
                for name, r in session.project.smoothing.items()}
    data = {"summary": result.summary(), "method": result.method, "batches": result.num_batches,
            "smoothing": smoothed,
            "world_size": context.world_size,
            "output_sqnr_db": result.output_sqnr_db, "sqnr_batches": result.sqnr_batches,
            "warnings": result.warnings, "unused": result.unused, "picked": result.picked_methods(),
            "quantizers": {n: {"amax": q.amax.tolist(), "method": q.method, "samples": q.num_samples,
                               "nonfinite": q.nonfinite_count,
                               "choice": None if q.choice is None else q.choice.to_dict(),
                               "warnings": [w.to_dict() for w in q.warnings]} for n, q in result.quantizers.items()}}
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
    lines = [result.summary()] + [f"  {n}: {q.choice.reason}" for n, q in result.quantizers.items() if q.choice]
    lines += [f"warning: {w}" for w in result.warnings]
    if args.smoothquant is not None or args.awq is not None:
        folded = sum(1 for r in smoothed.values() if r["folded_into"])
        lines.insert(1, f"smoothing: {len(smoothed)} layers ({folded} folded into the layer before, "
                        f"{len(smoothed) - folded} as a Mul)" if smoothed else "smoothing: none (original weights)")
    if args.evaluate and failed is None:
        lines.append(f"evaluation: {evaluation.summary()}")
    emit(args, data, "\n".join(lines))
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
    session = open_project(args)
    metric = _metric_option(args)
    with Progress(args, "evaluating") as progress:
        evaluation = session.evaluate(metric, num_batches=args.num_batches, rounding=args.rounding,
                                      progress=progress, cancel=progress.cancel)
    label = evaluation.quantized_as
    lines = [f"  {'':<22} {'FP32':>10} {label:>10} {'delta':>10}",
             f"  {evaluation.name:<22} {fmt(evaluation.fp32):>10} {fmt(evaluation.int8):>10} "
             f"{fmt(evaluation.delta):>10}   ({evaluation.metric.get('direction')} is better"
             # SQNR against the FP32 output: FP32 scores +inf against itself, and no difference with it means anything
             f"{'; FP32 is the reference, no delta' if math.isinf(evaluation.fp32) else ''})",
             f"  output SQNR {label} vs FP32: {fmt(evaluation.output_sqnr_db, ' dB')} ({evaluation.num_batches} "
             "batches)"]
    emit(args, evaluation.to_dict(), "\n".join(lines))
    return EXIT_OK


def _cmd_sensitivity(args: argparse.Namespace) -> int:
    from workbench.launcher import job_context

    with job_context() as context:
        session = open_project(args)
        metric = _metric_option(args)
        ladder = _ladder_option(args, context)  # refused before the ranking's work, not after
        with Progress(args, "sensitivity", context.is_main) as progress:
            result = session.sensitivity(scheme=args.scheme, metric=metric, num_batches=args.num_batches,
                                         units=None if args.units == "layers" else args.units,
                                         progress=progress, cancel=progress.cancel, context=context,
                                         sequential=args.sequential)
            fallback = None
            applied: list[Any] = []
            from workbench.analysis.goals import resolve_goal  # the rule the GUI's searches follow too

            goal = resolve_goal(tolerance=args.tolerance, target=args.target, fp32=result.fp32,
                                quantized=result.quantized, higher_is_better=result.higher_is_better,
                                metric_name=result.metric_name)
            tolerance, target, goal_note = goal.tolerance, goal.target, goal.note or None
            if args.sequential:  # the block searches count a tolerance from the output SQNR they measure (a note)
                tolerance, target, goal_note = args.tolerance, args.target, None
            budget = _budget_option(args, session)
            if ladder is not None or budget is not None:
                fallback = session.ladder(ladder or "int8,float", target=target, tolerance=tolerance,
                                          budget_bytes=budget, metric=metric, progress=progress,
                                          cancel=progress.cancel, revisit_pins=args.revisit_pins,
                                          sequential=args.sequential)
                if args.apply:
                    applied = session.apply_ladder(fallback)
                    if any(p not in ("float", "custom") for p in fallback.precisions.values()):
                        session.calibrate(sequential=args.sequential or None)  # the new precisions' ranges
            elif tolerance is not None or target is not None:
                fallback = session.fallback(tolerance=tolerance, target=target, max_units=args.max_units,
                                            metric=metric, apply=args.apply, progress=progress,
                                            cancel=progress.cancel, context=context, sequential=args.sequential)
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
        lines.append(f"  {unit.rank:>3}. {unit.name:<36} {fmt(unit.value)}  ({versus})")
    if fallback is not None and hasattr(fallback, "ladder"):
        data["ladder"] = fallback.to_dict()
        data.update(precisions=fallback.precisions, value=fallback.value, weight_bytes=fallback.weight_bytes,
                    float_bytes=fallback.float_bytes)
        if goal_note:
            data["ladder"]["goal_note"] = goal_note
            lines.append(goal_note)
        lines.append(fallback.summary())
        lines += [f"  {name:<36} {precision}" for name, precision in fallback.promoted.items()]
        lines += [f"note: {note}" for note in fallback.notes]
        if args.apply:
            data["applied_changes"] = [change.to_dict() for change in applied]
            lines.append(f"applied: {len(applied)} layer{'s' if len(applied) != 1 else ''} changed precision, "
                         "calibrated" + (":" if applied else " (every layer was in its chosen precision)"))
            lines += [f"  {change.text()}" for change in applied]
    elif fallback is not None:
        data["fallback"] = fallback.to_dict()
        data.update(_fallback_mix(session, fallback))
        if goal_note:
            data["fallback"]["goal_note"] = goal_note
            lines.append(goal_note)
        lines.append(fallback.summary())
        if fallback.walk:  # block by block: which points were measured, and the checking walks
            lines += [f"note: {note}" for note in fallback.notes]
        if args.apply:
            lines.append("applied: the chosen layers are left in float in the project")
    emit(args, data, "\n".join(lines))
    if fallback is not None and not fallback.reached:  # scripts can tell: the ranking and the curve are saved
        print(f"workbench: the fallback search did not reach its goal (exit {EXIT_NOT_REACHED}); "
              "the ranking and the search are saved in the project", file=sys.stderr)
        return EXIT_NOT_REACHED
    return EXIT_OK


def _ladder_option(args: argparse.Namespace, context: Any) -> str | None:
    """``--ladder`` checked (None: not given, or the default ``int8,float``, which is the fallback search)."""
    if args.ladder is None:
        return None
    from workbench.analysis.ladder import DEFAULT_LADDER, parse_ladder

    try:
        rungs = parse_ladder(args.ladder)
    except ValueError as error:
        raise UsageError(f"--ladder: {error}") from None
    if args.tolerance is None and args.target is None and args.budget_bytes is None and args.budget_bits is None:
        raise UsageError("--ladder needs a goal: --target, --tolerance, --budget-bytes or --budget-bits")
    if tuple(rungs) == DEFAULT_LADDER:
        return None
    if context.world_size > 1:
        raise UsageError("--ladder runs in one process, so it does not take --workers: each step keeps or undoes one "
                         "promotion from the measurement before it (nothing to share among processes), and it "
                         "calibrates a model per rung first. Rank the layers with 'workbench sensitivity --workers N' "
                         "(distributed), then run the ladder without --workers: it reuses that ranking.")
    return ",".join(p.value for p in rungs)


def _budget_option(args: argparse.Namespace, session: Any) -> int | None:
    """The weight budget in bytes: ``--budget-bytes``, or ``--budget-bits`` (average bits per weight element,
    as Model Optimizer's effective bits) times the model's parameters."""
    if args.budget_bytes is not None and args.budget_bits is not None:
        raise UsageError("give --budget-bytes or --budget-bits, not both")
    if args.budget_bytes is not None:
        if args.budget_bytes < 0:
            raise UsageError(f"--budget-bytes must be >= 0, got {args.budget_bytes}")
        return int(args.budget_bytes)
    if args.budget_bits is not None:
        if not 0 < args.budget_bits <= 32:
            raise UsageError(f"--budget-bits is average bits per weight, in (0, 32]; got {args.budget_bits:g}")
        elements = sum(p.numel() for p in session.float_model.parameters())
        return int(args.budget_bits * elements / 8)
    return None


def _fallback_mix(session: Any, fallback: Any) -> dict[str, Any]:
    """The fallback search's mix as a ladder reports it: every layer's precision, the weight bytes of the mix
    and of all-float."""
    from workbench.quant.algorithms.precision import Precision, weight_bytes

    precisions = session.precisions()
    for unit in fallback.chosen:
        for layer in session.layers_of(unit):
            precisions[layer] = Precision.FLOAT
    model = session.quantized_model()
    return {"precisions": {k: (v.value if v is not None else "custom") for k, v in precisions.items()},
            "value": fallback.final_value, "weight_bytes": weight_bytes(model, precisions),
            "float_bytes": weight_bytes(model, {k: Precision.FLOAT for k in precisions})}


def _names(text: str | None) -> tuple[str, ...] | None:
    """``"logits, pred_boxes"`` as names; None when nothing was given."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    return names or None


def _cmd_export(args: argparse.Namespace) -> int:
    session = open_project(args)
    folder = Path(args.output).parent if args.output else None
    made = folder is not None and not folder.exists()
    if made:  # `-o out/x.onnx` into a folder that is not there yet: make it (and take it back if nothing lands)
        folder.mkdir(parents=True)
    try:
        report = session.export(args.output, opset=args.opset, dynamic_batch=not args.static_batch,
                                amax_json=args.amax_json or None, calibration_cache=args.calibration_cache or None,
                                force=args.force, fp8_ops=args.fp8_ops, outputs=_names(args.outputs),
                                static_sequence=True if args.static_sequence else None,
                                min_cosine=args.min_cosine, strict=args.strict)
    except BaseException:
        if made and not any(folder.iterdir()):
            folder.rmdir()
        raise
    try:
        session.save()
    except BaseException as error:  # a full disk, Ctrl-C: files the project does not record would block a re-export
        from workbench.session import SessionError
        from workbench.session.exports import discard

        discard(session.unsaved_export_files)
        if isinstance(error, Exception):
            raise SessionError(f"{error} The export's new files were removed (the project could not record "
                               "them); export again once the project can be saved.") from error
        raise
    written = [report.path] + [path for path in (report.amax_json_path, report.calibration_cache_path,
                                                 report.float_onnx_path) if path]
    from workbench.export.streamed_export import ROUTE_KIND  # loaded by the export already

    route = [note for note in report.notes if report.entry_kinds.get(note) == ROUTE_KIND]  # a lazily opened model's
    emit(args, {**report.to_dict(), "files": written},
         report.summary() + f"\nexporter: {report.exporter_note}" + "".join(f"\nroute: {note}" for note in route)
         + "".join(f"\nwarning: {warning}" for warning in report.warnings)
         + "".join(f"\nnote: {note}" for note in report.format_notes)
         + "\nwrote: " + ", ".join(written) + ("" if report.validated else " (NOT VALIDATED)"))
    return EXIT_OK if report.validated else EXIT_NOT_VALIDATED


def _cmd_finetune(args: argparse.Namespace) -> int:
    from workbench.training import recipe

    session = open_project(args)
    if args.reset:
        reset = session.reset_finetune()
        session.save()
        emit(args, {"reset": reset}, "back to the calibrated weights" if reset else "no fine-tuned weights in use")
        return EXIT_OK
    if args.train_data:
        typed = data_spec(args.train_data, args, args.batch_size)  # relative to where it was typed
        session.set_data("training", typed.absolute(Path.cwd()).relative_to(session.base_dir))
    options: dict[str, Any] = {}
    if args.original_lr is not None:
        options.update(recipe(args.original_lr, args.original_epochs))
    elif args.original_epochs is not None:
        raise UsageError("--original-epochs goes with --original-lr (the recipe needs both).")
    given = {"epochs": args.epochs, "lr": args.lr, "optimizer": args.optimizer, "schedule": args.schedule,
             "loss": typed_entrypoint(args.loss, session), "momentum": args.momentum,
             "weight_decay": args.weight_decay,
             "steps_per_epoch": args.steps_per_epoch, "amp": args.amp, "learn_amax": args.learn_amax}
    options.update({key: value for key, value in given.items() if value is not None})
    metric = _metric_option(args)
    with Progress(args, "fine-tuning") as progress:
        result = session.finetune(metric=metric, progress=progress, cancel=progress.cancel, **options)
    session.save()
    data = result.to_dict()
    data["summary"] = result.summary()
    lines = [result.summary(), f"  {'epoch':>5} {'train loss':>11} {'eval loss':>10} {'metric':>9} {'lr':>9}"]
    for record in [result.baseline] + result.history:
        best = "  best" if record.epoch == result.best_epoch else ""
        lines.append(f"  {record.epoch:>5} {fmt(record.train_loss):>11} {fmt(record.eval_loss):>10} "
                     f"{fmt(record.metric):>9} {fmt(record.lr):>9}{best}")
    for name, change in result.learned_amax.items():
        lines.append(f"  learned amax {name}: {change['before']:.4g} -> {change['after']:.4g}")
    for name, reason in result.learn_amax_skipped.items():
        lines.append(f"  amax kept for {name}: {reason}")
    if result.cancelled:
        lines.append("cancelled: the model has the best weights so far" if result.epochs_completed
                     else "cancelled before the first epoch ended: nothing changed")
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def _workers_option(command: argparse.ArgumentParser) -> None:
    command.set_defaults(distributed=True)
    command.add_argument("--workers", type=int, metavar="N",
                         help="run in N local processes (PyTorch's elastic launcher; one per GPU when there are "
                              "N GPUs), with the same result as one process; under torchrun, torchrun decides")


# The options of each command, added when it is chosen (workbench.cli.entry): the registries their choices and
# help texts come from are imported here, not for `workbench --help`. Every default a help text names is read
# from the project settings' defaults: one source of truth.


def _calibrate_options(cal: argparse.ArgumentParser) -> None:
    from workbench.project.settings import DEFAULTS
    from workbench.quant.algorithms.precision_registry import BLOCK_METHODS
    from workbench.quant.calib.methods import AMAX_METHODS, PERCENTILE, PERCENTILE_FLOOR, AmaxMethod

    calib_defaults = DEFAULTS.calibration
    cal.add_argument("--method", choices=AMAX_METHODS,
                     help=f"amax method of histogram quantizers (default: the project's; new projects: "
                          f"{calib_defaults.method}): {AmaxMethod.help_text()}")
    cal.add_argument("--num-batches", type=int, help="calibration batches to use (default: the project's; new "
                                                     f"projects: {calib_defaults.num_batches})")
    cal.add_argument("--percentile", type=float,
                     help=f"for --method percentile: {PERCENTILE.help.replace('%', '%%')}, {PERCENTILE.describe()}, "
                          f"e.g. 99.9 (default: the project's; new projects: {calib_defaults.percentile:g})")
    cal.add_argument("--block-method", choices=BLOCK_METHODS,
                     help="amax of INT4 weight blocks (int4w layers): max, or mse (per block, the max shrunk to the "
                          f"least squared error) (default: the project's; new projects: {calib_defaults.block_method})")
    cal.add_argument("--force", action="store_true", help=f"use a --percentile under {PERCENTILE_FLOOR:g} (almost "
                                                          "always a fraction typed for a percent: 0.999 for 99.9)")
    cal.add_argument("--evaluate", action="store_true", help="then compare FP32 and INT8 on the evaluation data")
    cal.add_argument("--smoothquant", metavar="ALPHA|off",
                     help="first smooth every quantized Linear's input with SmoothQuant of strength ALPHA in [0, 1] "
                          "(0.5 is the paper's default); off restores the original weights")
    cal.add_argument("--awq", choices=("on", "off"),
                     help="first search AWQ scales for the 4-bit weight-only layers (off: drop them)")
    cal.add_argument("--sequential", nargs="?", const="on", choices=("on", "off"),
                     help="one decoder block at a time (only that block's weights resident, activations spilled to "
                          "disk beyond a budget): the same amax as a whole-model run; with --workers each process "
                          "walks the blocks on its share of the batches; models without "
                          "repeated blocks are calibrated whole (default: the project's; new projects: "
                          f"{'on' if calib_defaults.sequential else 'off'})")
    _workers_option(cal)
    cal.set_defaults(func=_cmd_calibrate)


def _evaluate_options(evaluate: argparse.ArgumentParser) -> None:
    from workbench.analysis.metrics import DIRECTIONS, metric_choices_text
    from workbench.quant.kernels.fake_quant import ROUNDINGS

    evaluate.add_argument("--metric", help=f"{metric_choices_text()} (default: the project's metric)")
    evaluate.add_argument("--metric-direction", choices=DIRECTIONS, help="for a user metric")
    evaluate.add_argument("--num-batches", type=int, help="evaluation batches to use (default: all)")
    evaluate.add_argument("--rounding", choices=ROUNDINGS,
                          help="how the quantizers round: onnx is what the exported graph computes (an export's "
                               "INT8-vs-FP32 headline is measured so); default: the quantizers' own "
                               "(pytorch_quantization's formula). They differ only at rounding ties")
    evaluate.set_defaults(func=_cmd_evaluate)


def _sensitivity_options(sens: argparse.ArgumentParser) -> None:
    from workbench.analysis.metrics import DIRECTIONS
    from workbench.analysis.results import SCHEMES
    from workbench.analysis.units import UNIT_SCHEMES
    from workbench.project.settings import DEFAULTS
    from workbench.quant.algorithms.precision_registry import Precision

    precision_names = "precisions: " + ", ".join(p.value for p in Precision)
    sens.add_argument("--scheme", choices=SCHEMES, default=SCHEMES[0])
    sens.add_argument("--units", choices=UNIT_SCHEMES, default="layers",
                      help="what is switched together: each quantized layer (an attention's products together), "
                           "or each transformer block (a readable ranking of a 12-layer ViT)")
    sens.add_argument("--metric", help=f"override the project's metric (new projects: {DEFAULTS.metric.name})")
    sens.add_argument("--metric-direction", choices=DIRECTIONS)
    sens.add_argument("--num-batches", type=int, help="evaluation batches to use")
    sens.add_argument("--sequential", action="store_true",
                      help="one decoder block at a time (only that block's weights resident): each layer's SQNR at "
                           "its block's output with it alone quantized, instead of whole-model passes; no --metric. "
                           "With a goal (--tolerance, --target, --ladder, --budget-*), the fallback or ladder search "
                           "is block by block too: each layer's noise on each rung costed at its block's output, one "
                           "global choice for the model output's SQNR, checked end to end")
    sens.add_argument("--top", type=int, default=10, help="how many layers to print")
    sens.add_argument("--tolerance", type=float, help="fallback search: get within this of FP32 (for SQNR, whose "
                                                      "FP32 value is infinite: this many dB above all-INT8)")
    sens.add_argument("--target", type=float, help="fallback search: reach this metric value instead")
    sens.add_argument("--max-units", type=int, help="fallback search: at most this many layers in float")
    sens.add_argument("--apply", action="store_true", help="leave the fallback's layers in float in the project "
                                                           "(a ladder: set every layer to its chosen precision)")
    sens.add_argument("--ladder", metavar="P1,P2,...",
                      help="mixed-precision search: precisions cheapest first, each unit promoted one rung at a time "
                           f"until the goal is met (default int8,float: the fallback search); {precision_names}")
    sens.add_argument("--revisit-pins", action="store_true",
                      help="ladder: search the layers set by hand too (by default a layer whose precision or "
                           "descriptors were set by hand keeps them: a pin)")
    sens.add_argument("--budget-bytes", type=int, help="ladder goal: the best metric whose weights fit in this many "
                                                       "bytes (scales included)")
    sens.add_argument("--budget-bits", type=float, help="ladder goal: the best metric at this many bits per weight "
                                                        "on average (Model Optimizer's effective bits)")
    _workers_option(sens)
    sens.set_defaults(func=_cmd_sensitivity)


def _export_options(export: argparse.ArgumentParser) -> None:
    from workbench.opsets import FORMAT_OPSET
    from workbench.project.settings import DEFAULTS
    from workbench.quant.algorithms.precision_registry import FP8_OPS

    export.add_argument("-o", "--output", help="the .onnx file (default: next to the project)")
    export.add_argument("--opset", type=int, help=f"ONNX opset (default: the project's, {DEFAULTS.export.opset} for "
                                                  f"new projects); raised to what the formats in use need: FP8 "
                                                  f"{FORMAT_OPSET['fp8']}, INT4 weights {FORMAT_OPSET['int4']}")
    export.add_argument("--fp8-ops", choices=FP8_OPS,
                        help="how FP8 layers are written: standard QuantizeLinear to float8e4m3fn (opset 19, "
                             "TensorRT 10+), or trt: pytorch-quantization's TRT_FP8QuantizeLinear custom ops for "
                             "TensorRT 8.6/9 (validated in the standard form: onnxruntime cannot run them) "
                             "(default: the project's; new projects: standard)")
    export.add_argument("--static-batch", action="store_true", help="keep the sample's batch size fixed")
    export.add_argument("--static-sequence", action="store_true",
                        help="keep the sample's sequence length fixed (a model that loops over the sequence in "
                             "Python, as Mamba's scan does; remembered for the project)")
    export.add_argument("--outputs", help="the model's outputs the file returns, by name, comma-separated (logits,"
                                          "pred_boxes; a name keeps every tensor under it) (default: the project's; "
                                          "new projects: every tensor the model returns, named after its field)")
    export.add_argument("--force", action="store_true",
                        help="overwrite the .onnx file even if this project did not write it (or it changed since)")
    export.add_argument("--amax-json", action="store_true", help="also write the amax table as JSON")
    export.add_argument("--calibration-cache", action="store_true",
                        help="also write a TensorRT calibration cache (implicit quantization)")
    export.add_argument("--min-cosine", type=float,
                        help="parity threshold for this export: the lowest cosine of onnxruntime's outputs with the "
                             f"fake-quant model's (default: the project's export.min_cosine, "
                             f"{DEFAULTS.export.min_cosine} for new projects; 'set --export min_cosine=...')")
    export.add_argument("--strict", action="store_true",
                        help="refuse a file that fails the parity check (default: write it marked 'not validated', "
                             f"with the diagnosis of where and why, and exit with {EXIT_NOT_VALIDATED})")
    export.set_defaults(func=_cmd_export)


def _finetune_options(tune: argparse.ArgumentParser) -> None:
    from workbench.analysis.metrics import DIRECTIONS
    from workbench.project.settings import DEFAULTS
    from workbench.sources.data_source import DataSpec

    tune_defaults = DEFAULTS.finetune
    tune.add_argument("--epochs", type=int, help="passes over the training data (recipe: ~10%% of the original; "
                                                 f"default: {tune_defaults.epochs})")
    tune.add_argument("--lr", type=float, help="starting learning rate (recipe: 1%% of the original; default: "
                                               f"{tune_defaults.lr})")
    tune.add_argument("--original-lr", type=float, help="derive --lr (and --epochs with --original-epochs) from "
                                                        "the original training by the reference recipe")
    tune.add_argument("--original-epochs", type=int, help="the original training's epochs")
    tune.add_argument("--optimizer", choices=["sgd", "adam"])
    tune.add_argument("--schedule", choices=["cosine", "constant"],
                      help="cosine: anneal to 1%% of --lr by the last step (default)")
    tune.add_argument("--momentum", type=float, help=f"SGD momentum (default: {tune_defaults.momentum})")
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
    tune.add_argument("--batch-size", type=int, default=DataSpec.batch_size, help="for --train-data")
    tune.add_argument("--num-batches", type=int, help="for --train-data: batches per pass (default: all)")
    tune.add_argument("--shuffle", action="store_true", help="for --train-data")
    tune.add_argument("--seed", type=int, default=DataSpec.seed, help="for --train-data")
    tune.add_argument("--resize", type=int, help="for --train-data images")
    tune.add_argument("--crop", type=int, help="for --train-data images")
    tune.add_argument("--mean", type=float, nargs="+", help="for --train-data images")
    tune.add_argument("--std", type=float, nargs="+", help="for --train-data images")
    tune.add_argument("--grayscale", action="store_true", help="for --train-data images")
    tune.add_argument("--reset", action="store_true", help="drop the fine-tuned weights: back to the calibrated "
                                                           "model's own")
    tune.set_defaults(func=_cmd_finetune)


COMMANDS: tuple[Command, ...] = (
    Command("calibrate", "calibrate on the project's calibration data", _calibrate_options),
    Command("evaluate", "a metric on the FP32 and the INT8 model, and the output SQNR", _evaluate_options),
    Command("sensitivity", "rank layers by sensitivity; optionally search a fallback set", _sensitivity_options),
    Command("export", "write validated QDQ ONNX", _export_options),
    Command("finetune", "quantization-aware fine-tuning of the calibrated model (amax fixed)", _finetune_options),
)
