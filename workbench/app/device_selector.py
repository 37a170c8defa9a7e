"""The toolbar's device selector: where calibration, analysis and export run.

It offers the CPU, each CUDA device torch sees, and "all GPUs (N)" when there are several. A single
device is the project's ``device`` setting, changed through the controller (the session moves its
models, or says why it cannot). "All GPUs" is this window's choice, not a setting: the project runs on
cuda:0, and the controller runs calibration, sensitivity and the fallback search in one process per
GPU (:mod:`workbench.session.workers`); the other jobs stay on cuda:0, and the log says so.
"""
from __future__ import annotations

import torch
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QWidget

from workbench.app.controller import Controller
from workbench.session.workers import WORKER_JOBS

__all__ = ["DeviceSelector", "available_devices", "ALL_GPUS"]

ALL_GPUS = "all GPUs"  # the item's data: not a torch device, never stored in the project
FIRST_GPU = "cuda:0"   # where the project runs while all GPUs are chosen


def available_devices() -> list[tuple[str, str]]:
    """(label, data) for the CPU, each CUDA device and, with more than one, all of them, as listed."""
    devices = [("CPU", "cpu")]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        for index in range(count):
            devices.append((f"cuda:{index} · {torch.cuda.get_device_name(index)}", f"cuda:{index}"))
        if count > 1:
            devices.append((f"all GPUs ({count})", ALL_GPUS))
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
            if device == ALL_GPUS:
                self.setItemData(self.count() - 1, f"{', '.join(WORKER_JOBS)}: one process per GPU; the other "
                                 f"jobs on {FIRST_GPU}", Qt.ItemDataRole.ToolTipRole)
        self.activated.connect(self._chosen)

    def show_session_device(self) -> None:
        """Select what the controller uses: all GPUs, or the open session's device (listed as not available
        when this machine lacks it)."""
        session = self.controller.session
        if session is None:
            return
        device = ALL_GPUS if self.controller.workers > 1 and self.findData(ALL_GPUS) >= 0 else str(session.device)
        position = self.findData(device)
        if position < 0:
            self.addItem(f"{device} (not available)", device)
            position = self.count() - 1
        self.setCurrentIndex(position)

    def _chosen(self, _index: int) -> None:
        choice = self.currentData()
        session = self.controller.session
        if session is None:
            return
        device = FIRST_GPU if choice == ALL_GPUS else choice
        if str(session.device) != device:
            self.controller.set_setting("device", device)
        if str(self.controller.session.device) == device:  # not refused
            self.controller.use_workers(torch.cuda.device_count() if choice == ALL_GPUS else 1)
        self.device_set.emit()  # the window shows what is in use now
