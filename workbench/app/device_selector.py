"""The toolbar's device selector: where calibration, analysis and export run.

It offers the CPU and each CUDA device torch sees. Choosing one changes the project's ``device``
setting through the controller (the session moves its models, or says why it cannot).
"""
from __future__ import annotations

import torch
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QWidget

from workbench.app.controller import Controller

__all__ = ["DeviceSelector", "available_devices"]


def available_devices() -> list[tuple[str, str]]:
    """(label, device) for the CPU and each CUDA device, as the selector lists them."""
    devices = [("CPU", "cpu")]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            devices.append((f"cuda:{index} · {torch.cuda.get_device_name(index)}", f"cuda:{index}"))
    return devices


class DeviceSelector(QComboBox):
    """A combo box of devices; ``device_set`` after the user chose one and the controller was asked."""

    device_set = Signal()

    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.setToolTip("Where calibration, analysis and export run")
        for label, device in available_devices():
            self.addItem(label, device)
        self.activated.connect(self._chosen)

    def show_session_device(self) -> None:
        """Select the open session's device (listed as not available when this machine lacks it)."""
        session = self.controller.session
        if session is None:
            return
        device = str(session.device)
        position = self.findData(device)
        if position < 0:
            self.addItem(f"{device} (not available)", device)
            position = self.count() - 1
        self.setCurrentIndex(position)

    def _chosen(self, _index: int) -> None:
        device = self.currentData()
        session = self.controller.session
        if session is None or str(session.device) == device:
            return
        self.controller.set_setting("device", device)
        self.device_set.emit()  # the window shows the device in use (unchanged if the session refused)
