"""Render resources/icons/quant-workbench.svg to the PNG sizes desktops use (256 px by default).

    python packaging/render_icon.py            # writes resources/icons/quant-workbench.png
    python packaging/render_icon.py 512 out.png
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"


def render(size: int = 256, target: Path | None = None) -> Path:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 - painting needs one
    renderer = QSvgRenderer(str(ICONS / "quant-workbench.svg"))
    if not renderer.isValid():
        raise SystemExit("the SVG icon does not parse")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    target = target or ICONS / "quant-workbench.png"
    if not image.save(str(target)):
        raise SystemExit(f"could not write {target}")
    return target


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    print(render(size, Path(sys.argv[2]) if len(sys.argv) > 2 else None))
