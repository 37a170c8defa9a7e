"""How fast the model tree opens, updates, filters, scrolls and resizes with 10,000 modules.

Run: ``python bench/gui_tree.py [--modules N] [--session]``. Uses the offscreen platform unless
``QT_QPA_PLATFORM`` says otherwise. Prints, measured in this run:

* building the Qt model from the session's rows (``ModuleTreeModel.set_views``) and an update after
  an edit (every row re-read, only changed rows announced);
* the view: first show with the top levels expanded, ``expandAll``, scrolling page by page through the
  whole expanded tree with a synchronous repaint per page (the worst page is what a user feels),
  resizing columns, and filtering by substring, regex and type;
* with ``--session``: a real :class:`Session` on the same model (its creation, ``tree()``,
  ``layers()`` and the rebuild after one decision), which is what the window waits for after an
  edit. Creating it takes a while on 10,000 modules.

No thresholds: the numbers are for reading (the target is no single step over 100 ms).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtWidgets import QApplication, QTreeView  # noqa: E402

from workbench.app.controller import Controller  # noqa: E402
from workbench.app.tree_model import COLUMNS, EXPAND_ALL_MATCHES, ModuleTreeModel  # noqa: E402
from workbench.app.tree_widget import ModelTreeWidget  # noqa: E402
from workbench.graph import describe_model  # noqa: E402
from workbench.quant import replace_to_quantization_module  # noqa: E402
from workbench.session import LayerView  # noqa: E402

MODEL_CODE = textwrap.dedent('''
    from torch import nn

    class Block(nn.Module):
        """conv, bn, relu, linear: four modules plus the block itself."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(4)
            self.relu = nn.ReLU()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(self.relu(self.bn(self.conv(x))).transpose(1, 3)).transpose(1, 3)

    def make(modules=10000):
        per_stage = 20 * 5 + 1
        stages = max(1, modules // per_stage)
        return nn.Sequential(*(nn.Sequential(*(Block() for _ in range(20))) for _ in range(stages)))
''')


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def synthetic_views(modules: int):
    """describe_model of the bench model, and one LayerView per quantizable module (as Session.layers gives)."""
    namespace: dict = {}
    exec(compile(MODEL_CODE, "bench_model", "exec"), namespace)  # noqa: S102 - our own code above
    model = namespace["make"](modules)
    replace_to_quantization_module(model)
    tree = describe_model(model)

    def views(flip: str | None = None):
        return [LayerView(m.name, m.type_name.removeprefix("Quant"), m.name != flip, "module",
                          "int8 per-tensor hist/entropy" if m.name != flip else "float", "int8 per-channel(0) max",
                          "3.142", None, m.num_params) for m in tree.modules if m.quantizable]

    return tree, views


def session_views(modules: int):
    """A real Session on the bench model (entry point in a temporary file, random tensor data)."""
    import torch

    from workbench.session import Session
    from workbench.sources.data_source import DataSpec
    from workbench.sources.model_source import ModelSpec

    folder = Path(tempfile.mkdtemp(prefix="gui-tree-bench-"))
    (folder / "big.py").write_text(MODEL_CODE)
    torch.save(torch.randn(8, 4, 4, 4), folder / "x.pt")
    seconds, session = timed(lambda: Session.create(
        ModelSpec("entrypoint", f"{folder}/big.py:make", {"modules": modules}),
        DataSpec("tensors", str(folder / "x.pt"), batch_size=4), trust_code=True))
    print(f"session: create {seconds:.1f} s")
    seconds, tree = timed(session.tree)
    print(f"session: first tree() {seconds:.2f} s (builds the quantized model)")
    seconds, layers = timed(session.layers)
    print(f"session: layers() {seconds * 1000:.0f} ms")
    first = layers[0].name
    seconds, _ = timed(lambda: (session.set_quantize([first], False), session.layers()))
    print(f"session: one decision + layers() {seconds:.2f} s (the rebuild an edit costs)")
    seconds, _ = timed(session.tree)
    print(f"session: tree() after it {seconds * 1000:.0f} ms")

    def views(flip: str | None = None):
        return session.layers()

    return tree, views


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=10_000)
    parser.add_argument("--session", action="store_true", help="also time a real Session (slow to create)")
    args = parser.parse_args()
    app = QApplication.instance() or QApplication(sys.argv[:1])

    tree, views = session_views(args.modules) if args.session else synthetic_views(args.modules)
    layers = views()
    print(f"tree: {len(tree):,} modules, {len(layers):,} quantizable layers")

    model = ModuleTreeModel()
    seconds, _ = timed(lambda: model.set_views(tree, layers))
    print(f"model build (set_views, one pass): {seconds * 1000:.1f} ms")
    changed = views(flip=layers[len(layers) // 2].name)
    seconds, _ = timed(lambda: model.set_views(tree, changed))
    print(f"model update after an edit (all rows compared): {seconds * 1000:.1f} ms")

    # the real left-dock widget (filter box, proxy, view), fed the same rows; a first throwaway
    # window takes the one-off costs of any Qt app (fonts, style) out of the numbers
    warm = QTreeView()
    warm.show()
    app.processEvents()
    warm.close()
    widget = ModelTreeWidget(Controller())
    widget.resize(900, 800)
    view = widget.view

    def first_show():
        widget.model.set_views(tree, layers)
        widget._after_reset()
        widget.show()
        app.processEvents()
        view.viewport().repaint()

    seconds, _ = timed(first_show)
    print(f"widget: build + first show (top level open): {seconds * 1000:.1f} ms")
    seconds, _ = timed(lambda: (view.expandAll(), view.viewport().repaint()))
    print(f"view: expandAll + repaint: {seconds * 1000:.1f} ms")

    bar = view.verticalScrollBar()
    pages, worst, total = 0, 0.0, 0.0
    for value in range(0, bar.maximum() + 1, max(1, bar.pageStep())):
        start = time.perf_counter()
        bar.setValue(value)
        view.viewport().repaint()  # a full repaint per page: the worst case (a wheel scroll repaints a strip)
        app.processEvents()
        step = time.perf_counter() - start
        worst, total, pages = max(worst, step), total + step, pages + 1
    print(f"view: scrolled {pages} pages through {bar.maximum() + bar.pageStep():,} rows: "
          f"mean {total / pages * 1000:.1f} ms/page, worst {worst * 1000:.1f} ms")

    header = view.header()
    worst = 0.0
    for step in range(20):
        start = time.perf_counter()
        header.resizeSection(step % len(COLUMNS), 80 + 7 * step)
        view.viewport().repaint()
        app.processEvents()
        worst = max(worst, time.perf_counter() - start)
    start = time.perf_counter()
    widget.resize(1200, 900)
    app.processEvents()
    view.viewport().repaint()
    window_resize = time.perf_counter() - start
    print(f"view: column resize worst {worst * 1000:.1f} ms; widget resize {window_resize * 1000:.1f} ms")

    for label, text, regex, type_name in (("substring 'conv'", "conv", False, None),
                                          ("regex '^1[0-9]\\.5\\.'", r"^1[0-9]\.5\.", True, None),
                                          ("type Linear", "", False, "Linear"), ("cleared", "", False, None)):
        def apply(t=text, r=regex, k=type_name):
            widget.filter_edit.setText(t)
            widget.regex_box.blockSignals(True)
            widget.regex_box.setChecked(r)
            widget.regex_box.blockSignals(False)
            widget.type_combo.blockSignals(True)
            widget.type_combo.setCurrentText(k or "All types")
            widget.type_combo.blockSignals(False)
            widget.apply_filter()
            app.processEvents()
            view.viewport().repaint()

        seconds, _ = timed(apply)
        shown = "all expanded" if widget.proxy.matches and widget.proxy.matches <= EXPAND_ALL_MATCHES else "top level"
        print(f"filter {label}: {seconds * 1000:.1f} ms ({widget.proxy.matches:,} matches, {shown})")
    widget.close()
    widget.controller.shutdown()


if __name__ == "__main__":
    main()
