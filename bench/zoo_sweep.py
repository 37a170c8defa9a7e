"""Conformance sweep: real architectures end to end through the Session with the defaults, one row each.

Each architecture of bench/zoo_catalog.py (transformers from tiny configs saved as ``hf:`` folders, timm by
``timm:NAME``, torchvision / diffusers / ultralytics through entry points) runs what the CLI runs, ``new ->
calibrate -> export`` (INT8, the project defaults, two calibration batches of two samples), in its own
process of its own (forked from one that imported the libraries once) with a time limit, so that one crash or
hang does not end the sweep. Each row:

    model, family, weight GEMMs quantized (n/m, from the exported graph; the layers quantized when no file),
    attention products (MatMuls between two activations) with Q/DQ on both inputs (n/m, from the graph),
    outputs kept (ONNX outputs / tensors the model returns), export ok (which exporter), parity (cosine,
    onnxruntime vs the fake-quant model), INT8 SQNR (dB, output vs FP32 on the calibration data), seconds,
    and the failure's first line.

A model is *accepted* when the file was written with its parity explained (validated, or written "not
validated" with the parity diagnosis' verdict "rounding": see zoo_checks.parity_explained), every weight GEMM and
every attention product is quantized, every tensor output is kept, and the output is not constant (parity and
INT8 SQNR say nothing about a model whose output is: zoo_checks.degenerate_output). The header and the README say
how many of the accepted files were validated outright. Rows are appended to a JSONL file, so a run can be resumed.

    python bench/zoo_sweep.py [--only NAME ...] [--family F ...] [--resume] [--timeout 300] [--out FILE]
    python bench/zoo_sweep.py --markdown [--out FILE]    # the README's table from the rows
    python bench/zoo_sweep.py --merge NEW.jsonl ... --out MERGED.jsonl   # newest row per model wins
    python bench/zoo_sweep.py --list

Run it in its own environment (bench/zoo_sweep_env.sh: torch's CUDA build, which torchvision's wheels need,
plus timm, transformers, diffusers, ultralytics); architectures whose library is missing are rows that say so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one model at a time, one thread: the machine is shared
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]  # this checkout's workbench, whatever the environment installed
import zoo_catalog  # noqa: E402
from zoo_checks import degenerate_output, parity_explained, run_entry, validated  # noqa: E402

DEFAULT_OUT = HERE / "results" / "zoo_sweep.jsonl"
COLUMNS = ("model", "family", "GEMMs", "attention", "outputs", "export", "parity", "SQNR dB", "s", "failure")


def versions() -> dict[str, str]:
    """The library versions this environment runs (absent ones say so)."""
    import importlib.metadata as metadata

    out = {}
    for package in ("torch", "torchvision", "timm", "transformers", "diffusers", "ultralytics", "onnx",
                    "onnxruntime"):
        try:  # an imported module's own version says which build (torch 2.13.0+cu130)
            out[package] = getattr(sys.modules.get(package), "__version__", None) or metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "absent"
    return out


def accepted(row: dict) -> bool:
    """The sweep's bar: the file written with its parity explained, every weight GEMM, attention product and output
    kept, and an output that varies (a constant one makes parity and SQNR say nothing: zoo_checks.degenerate_output)."""
    def full(pair) -> bool:
        return isinstance(pair, list) and pair[0] == pair[1]
    return bool(row.get("export_ok")) and parity_explained(row) and full(row.get("gemms")) \
        and full(row.get("attention")) and full(row.get("outputs")) and not degenerate_output(row)


def explained_by_rounding(row: dict) -> bool:
    """Accepted with its file written "not validated", the difference diagnosed as rounding."""
    return accepted(row) and not validated(row)


def _pair(pair) -> str:
    return f"{pair[0]}/{pair[1]}" if isinstance(pair, list) else (pair or "")


def cells(row: dict) -> list[str]:
    parity = row.get("cosine")
    sqnr = row.get("sqnr_db")
    return [row["model"], row["family"], _pair(row.get("gemms") or row.get("gemms_note")),
            _pair(row.get("attention")), _pair(row.get("outputs")),
            f"ok ({row.get('exporter')})" if row.get("export_ok") else "no",
            f"{parity:.6f}" if isinstance(parity, float) else "", f"{sqnr:.1f}" if isinstance(sqnr, float) else "",
            f"{row.get('seconds', 0):.0f}", (row.get("failure") or "")[:110]]


def print_row(row: dict, widths=(34, 22, 9, 9, 7, 18, 9, 7, 4)) -> None:
    values = cells(row)
    mark = "ok  " if accepted(row) else "FAIL"
    print(mark + " " + " ".join(v.ljust(w) for v, w in zip(values, widths)) + " " + values[-1], flush=True)


def read_rows(path: Path) -> dict[str, dict]:
    """The last row of each model in the JSONL file."""
    rows: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["model"]] = row
    return rows


PRELOAD = ("torch", "onnx", "onnxruntime", "transformers", "timm", "torchvision", "diffusers", "workbench.session",
           "workbench.export")


def preload() -> None:
    """Import the heavy libraries once in the parent: each model's process is forked from it and starts warm
    (under load an import of torch and transformers alone takes tens of seconds)."""
    import importlib

    for module in PRELOAD:
        try:
            importlib.import_module(module)
        except Exception:  # an absent library: the rows of its models say so
            pass


def _worker(name: str, path: str) -> None:
    import datetime as _datetime

    entry = next(e for e in zoo_catalog.all_entries() if e.name == name)
    progress = Path(path).with_suffix(".progress")
    row = run_entry(entry, ROOT, lambda partial: progress.write_text(json.dumps(partial)))
    row["versions"] = versions()
    row["date"] = _datetime.datetime.now(_datetime.timezone.utc).isoformat(timespec="seconds")
    Path(path).write_text(json.dumps(row))


def run_isolated(entry: zoo_catalog.Entry, timeout: float) -> dict:
    """One architecture in a forked process; a crash or a hang becomes a row that says so."""
    import multiprocessing

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo-") as folder:
        result = Path(folder) / "row.json"
        process = multiprocessing.get_context("fork").Process(target=_worker, args=(entry.name, str(result)))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            progress = result.with_suffix(".progress")
            partial = json.loads(progress.read_text()) if progress.is_file() else {}
            spent = ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in partial.get("stage_seconds", {}).items())
            where = f" (killed in {partial['stage']}" + (f", after {spent}" if spent else "") + ")" \
                if partial.get("stage") else ""
            return {"model": entry.name, "family": entry.family, "stage": "timeout",
                    "failure": f"timeout: no result after {timeout:.0f} s{where}",
                    "seconds": time.perf_counter() - start, "stage_seconds": partial.get("stage_seconds", {}),
                    "killed_in": partial.get("stage")}
        if result.is_file():
            return json.loads(result.read_text())
        return {"model": entry.name, "family": entry.family, "stage": "crash",
                "failure": f"crashed (exit code {process.exitcode}) before writing its row",
                "seconds": time.perf_counter() - start}


def header(rows: list[dict], env: dict[str, str] | None = None) -> str:
    good = sum(accepted(row) for row in rows)
    rate = 100.0 * good / len(rows) if rows else 0.0
    env = env or (rows[0].get("versions") if rows else {}) or {}
    rounding = sum(explained_by_rounding(row) for row in rows)
    text = f"accept rate: {good}/{len(rows)} ({rate:.1f}%; {good - rounding} validated, {rounding} rounding explained)"
    if env:
        text += "   " + ", ".join(f"{k} {v}" for k, v in env.items())
    return text


# where a failure belongs (issue 34's points), read off the row: (pattern in the failure, area)
AREAS = (
    ("weight GEMMs quantized", "placement (point 1): weights used without calling their module"),
    ("attention products quantized", "placement (point 1): functional operations of untraceable forwards"),
    ("outputs kept", "export (point 2): outputs dropped"),
    ("disagree", "parity (point 3)"),
    ("cosine", "parity (point 3)"),
    ("calibrate:", "placement (point 1): graph rules crash"),
    ("new:", "placement or loading (new)"),
    ("export:", "export (point 2)"),
    ("build:", "the sweep's model builds"),
    ("timeout", "time limit"),
    ("crashed", "process crash"),
)


def failure_text(row: dict) -> str:
    """The row's failure; a file written "not validated" says what the parity diagnosis found (rounding that
    accumulates in a sensitive network, against the model's own 1-ulp spread, is not a wrong graph)."""
    failure = row.get("failure") or "; ".join(row.get("shortfalls") or []) or ""
    if not failure and degenerate_output(row):  # a row from before the check: its SQNR says so
        failure = f"output constant: parity says nothing ({degenerate_output(row)})"
    if not failure and row.get("export_ok") and not validated(row):  # accepted, parity explained
        failure = f"file not validated (cosine {row.get('cosine') or float('nan'):.6f})"
    verdict = row.get("parity_verdict")
    if verdict and failure.startswith("file not validated") and "diagnosis:" not in failure:
        from workbench.export.parity import VERDICTS

        spread = row.get("parity_sensitivity_cosine")
        if spread is None:  # rows from before it was a field: the diagnosis' text says it
            import re

            found = re.search(r"model itself moves by up to \S+ \(cosine ([0-9.]+)\)", row.get("parity_diagnosis", ""))
            spread = float(found.group(1)) if found else None
        own = f", its own 1-ulp spread: cosine {spread:.6f}" if isinstance(spread, float) else ""
        head, _, rest = failure.partition(";")
        failure = f"{head} (diagnosis: {VERDICTS.get(verdict, verdict)}{own})" + (f";{rest}" if rest else "")
    return failure


def category(row: dict) -> tuple[str, str]:
    """(the failure with its numbers and names taken out, the area it belongs to) for a row not accepted."""
    import re

    failure = failure_text(row) or "not accepted"
    key = failure.split(" (float:")[0]
    key = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", key)  # counts and values
    key = re.sub(r"'[^']*'", "'X'", key)  # names of nodes, tensors, modules
    key = re.sub(r"\b[\w.]+\.(onnx|qwb|py)\b", "FILE", key)
    if ";" in key and ":" not in key.split(";")[0]:  # several shortfalls: the first one names the category
        key = key.split(";")[0]
    area = next((area for pattern, area in AREAS if pattern in failure), "other")
    return key[:80], area  # the first words: the same error at other lengths or nodes is one category


def categories(rows: list[dict]) -> list[dict]:
    """Failures grouped: how many models, an example model and its first error line, and the area."""
    groups: dict[str, dict] = {}
    for row in rows:
        if accepted(row):
            continue
        key, area = category(row)
        group = groups.setdefault(key, {"category": key, "area": area, "models": [],
                                        "example": row["model"], "first_line": (row.get("failure") or "")[:200]})
        group["models"].append(row["model"])
    return sorted(groups.values(), key=lambda g: -len(g["models"]))


def markdown(rows: list[dict]) -> str:
    """The README's table: a row per family with counts, then the failures with their reason."""
    families: dict[str, list[dict]] = {}
    for row in rows:
        families.setdefault(row["family"], []).append(row)
    good = sum(accepted(row) for row in rows)
    rounding = [row for row in rows if explained_by_rounding(row)]
    dates = sorted(row.get("date", "") for row in rows if row.get("date"))
    total = len(zoo_catalog.all_entries())
    swept = f" ({len(rows)} of the {total} architectures swept)" if len(rows) < total else ""
    lines = [f"Accept rate **{good}/{len(rows)} ({100.0 * good / max(len(rows), 1):.0f}%)**{swept}: "
             f"{good - len(rounding)} files validated, {len(rounding)} written \"not validated\" with the parity "
             "diagnosis explaining the difference as rounding (listed below)"
             f"{', swept ' + dates[-1][:10] if dates else ''} (`python bench/zoo_sweep.py`; "
             "INT8 with the defaults, tiny configs, random weights; "
             + ", ".join(f"{k} {v}" for k, v in ((rows[-1].get("versions") or {}) if rows else {}).items())
             + "). The checks are read off the exported file: a model without a file meets none of them.", "",
             "| family | accepted | file validated | GEMMs all quantized | attention both inputs | outputs kept | "
             "file written |",
             "|---|---|---|---|---|---|---|"]
    for family, members in families.items():
        def count(check, members=members) -> str:
            return f"{sum(1 for r in members if check(r))}/{len(members)}"
        lines.append(
            f"| {family} | {count(accepted)} | {count(lambda r: bool(r.get('export_ok')) and validated(r))} | "
            f"{count(lambda r: isinstance(r.get('gemms'), list) and r['gemms'][0] == r['gemms'][1])} | "
            f"{count(lambda r: isinstance(r.get('attention'), list) and r['attention'][0] == r['attention'][1])} | "
            f"{count(lambda r: isinstance(r.get('outputs'), list) and r['outputs'][0] == r['outputs'][1])} | "
            f"{count(lambda r: bool(r.get('export_ok')))} |")
    groups = categories(rows)
    if groups:
        lines += ["", "| failure | models | example | area |", "|---|---|---|---|"]
        lines += [f"| {g['category'][:90]} | {len(g['models'])} | `{g['example']}` | {g['area']} |" for g in groups]
    if rounding:
        lines += ["", "Accepted with the file written \"not validated\": every operation computes what PyTorch "
                  "does from the same inputs, the first codes that differ are rounding ties, and the file's "
                  "difference is within the fake-quant model's own movement under a 1-ulp change of its input "
                  "(random weights make these networks chaotic):", ""]
        for row in rounding:
            lines.append(f"- `{row['model']}`: {failure_text(row)[:220]}")
    failed = [row for row in rows if not accepted(row)]
    if failed:
        lines += ["", "Not accepted:", ""]
        for row in failed:
            why = failure_text(row) or f"file not validated (cosine {row.get('cosine') or float('nan'):.6f})"
            lines.append(f"- `{row['model']}`: {why[:220]}")
    return "\n".join(lines)


def merge(sources: list[Path], out: Path) -> dict[str, dict]:
    """Rows of ``out`` and of each of ``sources`` (JSONL), one per model: the newest by its date wins (a row
    without a date is older than any with one). Each row keeps the file it came from (``source_file``); ``out``
    is rewritten in catalogue order, each model once."""
    rows: dict[str, dict] = {}
    for path in [out, *sources]:
        for model, row in read_rows(path).items():
            row.setdefault("source_file", path.name)
            if model not in rows or row.get("date", "") >= rows[model].get("date", ""):
                rows[model] = row
    order = {entry.name: index for index, entry in enumerate(zoo_catalog.all_entries())}
    merged = dict(sorted(rows.items(), key=lambda item: order.get(item[0], len(order))))
    out.write_text("".join(json.dumps(row) + "\n" for row in merged.values()))
    return merged


START, END = "<!-- zoo-sweep:start -->", "<!-- zoo-sweep:end -->"


def write_readme(path: Path, table: str) -> None:
    """Replace what lies between the README's zoo-sweep markers with ``table``."""
    text = path.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{path}: no {START} ... {END} markers to write the table between.")
    head, rest = text.split(START, 1)
    path.write_text(f"{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="model names (or substrings of them)")
    parser.add_argument("--family", nargs="*", default=[], help="families (decoder, timm, vision, ...)")
    parser.add_argument("--resume", action="store_true", help="skip the models the output file already has")
    parser.add_argument("--skip", nargs="*", type=Path, default=[],
                        help="also skip the models these JSONL files have rows for (sweep the rest of a run)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per model (default: per entry; an entry the catalogue gives more, with a "
                             "reason, keeps its own)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSONL file rows are appended to")
    parser.add_argument("--markdown", action="store_true", help="print the README's table from the rows and exit")
    parser.add_argument("--readme", type=Path, help="write the table into this README, between its zoo-sweep markers")
    parser.add_argument("--list", action="store_true", help="list the architectures and exit")
    parser.add_argument("--categories", action="store_true", help="print the failures grouped by cause and exit")
    parser.add_argument("--merge", nargs="*", type=Path, default=[],
                        help="merge these JSONL files' rows into --out (newest row per model wins) and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--row", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    entries = zoo_catalog.all_entries()
    if args.worker:  # one model in this process (debugging a row: python bench/zoo_sweep.py --worker NAME --row F)
        _worker(args.worker, str(args.row))
        return 0
    if args.merge:
        merged = merge(args.merge, args.out)
        print(f"{args.out}: {len(merged)} architectures, {header(list(merged.values()))}")
        return 0
    if args.markdown or args.readme:
        table = markdown(list(read_rows(args.out).values()))
        if args.readme:
            write_readme(args.readme, table)
        else:
            print(table)
        return 0
    if args.categories:
        for group in categories(list(read_rows(args.out).values())):
            print(f"{len(group['models']):3d}  {group['area']}\n     {group['category']}\n     e.g. "
                  f"{group['example']}: {group['first_line']}\n     {', '.join(group['models'])}")
        return 0
    chosen = [e for e in entries if (not args.only or any(o == e.name or o in e.name for o in args.only))
              and (not args.family or e.family in args.family)]
    if args.list:
        for entry in chosen:
            print(f"{entry.name:44s} {entry.family}")
        return 0
    done = read_rows(args.out) if args.resume else {}
    elsewhere = {name for path in args.skip for name in read_rows(path)}
    todo = [e for e in chosen if e.name not in done and e.name not in elsewhere]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{len(chosen)} architectures, {len(todo)} to run; rows -> {args.out}")
    print(", ".join(f"{k} {v}" for k, v in versions().items()))
    print("     " + " ".join(c.ljust(w) for c, w in zip(COLUMNS, (34, 22, 9, 9, 7, 18, 9, 7, 4))) + " failure")
    rows = [done[e.name] for e in chosen if e.name in done]
    preload()
    for entry in todo:
        # an entry the catalogue gives a bigger budget, with its reason, keeps it whatever --timeout says
        limit = args.timeout or entry.timeout_s
        row = run_isolated(entry, max(limit, entry.timeout_s) if entry.timeout_reason else limit)
        rows.append(row)
        with args.out.open("a") as stream:
            stream.write(json.dumps(row) + "\n")
        print_row(row)
    print(header(rows, versions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
