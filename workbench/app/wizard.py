"""The New project wizard: model source, calibration data, evaluation data, input shape and metric.

It only gathers plain specs (:class:`ModelSpec`, :class:`DataSpec`): the project itself is created by
``controller.new_project`` in the background, exactly what ``workbench new`` does on the command line.
Each page checks its fields when the user presses Next and says what is wrong in a dialog.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from workbench.analysis.metrics import BUILTIN_METRICS, DEFAULT_METRIC, builtin_metric_labels
from workbench.project.settings import DEFAULTS
from workbench.session.new_project import DEFAULT_IMAGE_OPTIONS, factory_arguments, image_options, new_project_settings
from workbench.sources.data_source import TENSOR_SUFFIXES, DataSpec, InputSpec
from workbench.sources.errors import SourceError
from workbench.sources.model_source import DEMO_MODELS, ModelSpec

__all__ = ["NewProjectWizard", "DataSourceForm", "parse_floats"]


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise SourceError(f"{what} must be numbers separated by commas, got {text!r}.") from None
    if not values:
        raise SourceError(f"{what} needs at least one number.")
    return values


def _browse_row(edit: QLineEdit, browse: QPushButton) -> QWidget:
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(edit, 1)
    layout.addWidget(browse)
    return row


def _warn(parent: QWidget, title: str, error: BaseException) -> None:
    QMessageBox.warning(parent, title, str(error))


class ModelPage(QWizardPage):
    """Where the float model comes from."""

    KINDS = (("demo", "Built-in demo model"), ("entrypoint", "Python entry point (file.py:factory or package.module:"
                                                             "factory)"), ("pickle", "Pickled model (torch.save)"),
             ("hf", "Hugging Face folder (config.json + safetensors)"), ("timm", "timm model by name"))

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTitle("Model")
        self.setSubTitle("The trained float model to quantize.")
        self.kind = QComboBox()
        for key, text in self.KINDS:
            self.kind.addItem(text, key)
        self.demo = QComboBox()
        self.demo.addItems(DEMO_MODELS)
        self.demo.setToolTip("digits: a small CNN with trained weights and data; resnet*: random weights, for "
                             "structure and speed")
        self.entrypoint = QLineEdit()
        self.entrypoint.setPlaceholderText("models/net.py:build  or  my_package.models:build")
        self.kwargs = QLineEdit()
        self.kwargs.setPlaceholderText("num_classes: 10, width: 64   or  num_classes=10,width=64   (optional)")
        self.pickle = QLineEdit()
        self.pickle.setPlaceholderText("best.pt (a whole model saved with torch.save)")
        self.code_dir = QLineEdit()
        self.code_dir.setPlaceholderText("folder with the model's code (added to the import path)")
        self.weights = QLineEdit()
        self.weights.setPlaceholderText("optional: state_dict file (.pt, .pth, .safetensors)")
        self.hf_folder = QLineEdit()
        self.hf_folder.setPlaceholderText("models/bert-base (a folder written by save_pretrained)")
        self.timm_name = QLineEdit()
        self.timm_name.setPlaceholderText("vit_small_patch16_224, resnet50 ...")

        entry_form = QFormLayout()
        browse_py = QPushButton("Browse…")
        browse_py.clicked.connect(self._browse_entrypoint)
        entry_form.addRow("Entry point", _browse_row(self.entrypoint, browse_py))
        entry_form.addRow("Factory arguments", self.kwargs)
        pickle_form = QFormLayout()
        browse_pickle = QPushButton("Browse…")
        browse_pickle.clicked.connect(lambda: self._browse_file(self.pickle, "Pickled model", "Models (*.pt *.pth)"))
        browse_code = QPushButton("Browse…")
        browse_code.clicked.connect(lambda: self._browse_dir(self.code_dir))
        pickle_form.addRow("Model file", _browse_row(self.pickle, browse_pickle))
        pickle_form.addRow("Code folder", _browse_row(self.code_dir, browse_code))
        demo_form = QFormLayout()
        demo_form.addRow("Demo model", self.demo)
        hf_form = QFormLayout()
        browse_hf = QPushButton("Browse…")
        browse_hf.clicked.connect(lambda: self._browse_dir(self.hf_folder))
        hf_form.addRow("Model folder", _browse_row(self.hf_folder, browse_hf))
        timm_form = QFormLayout()
        timm_form.addRow("timm model", self.timm_name)
        self.stack = QStackedWidget()
        self.stack.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)  # no gap below it
        for form in (demo_form, entry_form, pickle_form, hf_form, timm_form):  # in the order of KINDS
            form.setContentsMargins(0, 0, 0, 0)  # aligned with the outer form's fields
            page = QWidget()
            page.setLayout(form)
            self.stack.addWidget(page)
        browse_weights = QPushButton("Browse…")
        browse_weights.clicked.connect(lambda: self._browse_file(
            self.weights, "Weights", "Weights (*.pt *.pth *.bin *.safetensors)"))
        self.trust_note = QLabel("Loading an entry point or a pickle runs its Python code on this machine: the "
                                 "last page asks you to trust it.")
        self.trust_note.setWordWrap(True)
        self.trust_note.setObjectName("hint")

        form = QFormLayout(self)
        form.addRow("Source", self.kind)
        form.addRow(self.stack)
        form.addRow("Weights", _browse_row(self.weights, browse_weights))
        form.addRow(self.trust_note)
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self._kind_changed()

    def _kind_changed(self) -> None:
        self.stack.setCurrentIndex(self.kind.currentIndex())
        self.trust_note.setVisible(self.kind.currentData() in ("entrypoint", "pickle"))

    def _browse_entrypoint(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Python file with the model factory", "", "Python (*.py)")
        if path:
            self.entrypoint.setText(f"{path}:")
            self.entrypoint.setFocus()

    def _browse_file(self, edit: QLineEdit, title: str, pattern: str) -> None:
        path, _ = QFileDialog.getOpenFileName(self, title, "", pattern + ";;All files (*)")
        if path:
            edit.setText(path)

    def _browse_dir(self, edit: QLineEdit) -> None:
        path = QFileDialog.getExistingDirectory(self, "Folder")
        if path:
            edit.setText(path)

    def spec(self) -> ModelSpec:
        kind = self.kind.currentData()
        weights = self.weights.text().strip() or None
        if kind == "demo":
            return ModelSpec("demo", self.demo.currentText(), {}, weights)
        if kind == "entrypoint":
            return ModelSpec("entrypoint", self.entrypoint.text().strip(), factory_arguments(self.kwargs.text()),
                             weights)
        if kind == "hf":
            return ModelSpec("hf", self.hf_folder.text().strip(), {}, weights)
        if kind == "timm":
            return ModelSpec("timm", self.timm_name.text().strip(), {}, weights)
        return ModelSpec("pickle", self.pickle.text().strip(), {}, weights, self.code_dir.text().strip() or None)

    def validatePage(self) -> bool:
        try:
            spec = self.spec()
            for path in spec.files():
                if spec.kind not in ("demo", "hf") and not path.exists():
                    raise SourceError(f"{path} does not exist.")
        except (SourceError, ValueError) as error:
            _warn(self, "Model source", error)
            return False
        return True


class DataSourceForm(QWidget):
    """One data source: demo digits, an image folder (with preprocessing), a tensor file or an entry point."""

    KINDS = (("demo", "Demo digits"), ("images", "Image folder"), ("tensors", "Tensor file (.npy .npz .pt "
                                                                             ".safetensors)"),
             ("entrypoint", "Python entry point (returns batches)"))

    def __init__(self, split: str, batch_size: int = DataSpec.batch_size, num_batches: int = 0,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.split = split
        self.kind = QComboBox()
        for key, text in self.KINDS:
            self.kind.addItem(text, key)
        self.path = QLineEdit()
        self.browse = QPushButton("Browse…")
        self.browse.clicked.connect(self._browse)
        self.path_row = _browse_row(self.path, self.browse)
        self.resize_spin = QSpinBox()
        self.resize_spin.setRange(0, 8192)
        self.resize_spin.setSpecialValueText("keep")
        self.resize_spin.setValue(DEFAULT_IMAGE_OPTIONS.resize or 0)
        self.crop_spin = QSpinBox()
        self.crop_spin.setRange(0, 8192)
        self.crop_spin.setSpecialValueText("none")
        self.crop_spin.setValue(DEFAULT_IMAGE_OPTIONS.crop or 0)
        self.mean = QLineEdit(", ".join(f"{v:g}" for v in DEFAULT_IMAGE_OPTIONS.mean))
        self.std = QLineEdit(", ".join(f"{v:g}" for v in DEFAULT_IMAGE_OPTIONS.std))
        self.mean.setToolTip("Per-channel mean to subtract (ImageNet models: 0.485, 0.456, 0.406)")
        self.std.setToolTip("Per-channel std to divide by (ImageNet models: 0.229, 0.224, 0.225)")
        self.grayscale = QCheckBox("grayscale")
        image_form = QFormLayout()
        image_form.addRow("Resize shorter side", self.resize_spin)
        image_form.addRow("Center crop", self.crop_spin)
        image_form.addRow("Mean", self.mean)
        image_form.addRow("Std", self.std)
        image_form.addRow("", self.grayscale)
        self.image_box = QGroupBox("Preprocessing")
        self.image_box.setLayout(image_form)
        self.batch_size = QSpinBox()
        self.batch_size.setRange(1, 65536)
        self.batch_size.setValue(batch_size)
        self.num_batches = QSpinBox()
        self.num_batches.setRange(0, 1_000_000)
        self.num_batches.setSpecialValueText("all")
        self.num_batches.setValue(num_batches)
        self.form = QFormLayout(self)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.form.addRow("Source", self.kind)
        self.form.addRow("Path", self.path_row)
        self.form.addRow(self.image_box)
        self.form.addRow("Batch size", self.batch_size)
        self.form.addRow("Number of batches", self.num_batches)
        self.hint = QLabel()
        self.hint.setObjectName("hint")
        self.hint.setWordWrap(True)
        self.form.addRow(self.hint)
        self.model_kind: str | None = None  # the model page's choice, which picks the defaults here
        self.kind_chosen = False  # the user picked a source: a later model change keeps it
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self.kind.activated.connect(lambda _index: setattr(self, "kind_chosen", True))
        self._kind_changed()

    def suit_model(self, model_kind: str | None, prefer: str | None = None) -> None:
        """Defaults that fit the model chosen: demo digits only for the demo model; token ids for a Hugging
        Face folder (an .npz whose arrays are named after the forward's arguments); ``prefer`` (a source kind)
        where it fits the model; a user's choice stays."""
        self.model_kind = model_kind
        if not self.kind_chosen:
            wanted = DEFAULT_DATA_KIND.get(model_kind or "", "tensors")
            if prefer is not None and (prefer != "demo" or model_kind == "demo"):
                wanted = prefer
            self.kind.setCurrentIndex(max(0, self.kind.findData(wanted)))
        self._kind_changed()

    def _kind_changed(self) -> None:
        kind = self.kind.currentData()
        self.form.setRowVisible(self.path_row, kind != "demo")
        self.form.setRowVisible(self.image_box, kind == "images")
        self.path.setPlaceholderText({"images": "folder of .jpg/.png (sub-folders are classes)",
                                      "tensors": "inputs.npz (arrays 'inputs' and optional 'labels')",
                                      "entrypoint": "data.py:batches  (a function returning an iterable of "
                                                    "batches)"}.get(kind, ""))
        self.browse.setVisible(kind in ("images", "tensors", "entrypoint"))
        self.hint.setText(data_hint(kind, self.model_kind))
        self.hint.setVisible(bool(self.hint.text()))
        if kind == "tensors" and self.model_kind in TOKEN_MODELS:
            self.path.setPlaceholderText("tokens.npz (arrays named after the forward's arguments: input_ids, "
                                         "attention_mask…)")

    def _browse(self) -> None:
        kind = self.kind.currentData()
        if kind == "images":
            path = QFileDialog.getExistingDirectory(self, "Image folder")
        else:
            pattern = "Tensors (" + " ".join(f"*{s}" for s in TENSOR_SUFFIXES) + ")" if kind == "tensors" \
                else "Python (*.py)"
            path, _ = QFileDialog.getOpenFileName(self, "Data", "", pattern + ";;All files (*)")
            if path and kind == "entrypoint":
                path += ":"
        if path:
            self.path.setText(path)

    def spec(self) -> DataSpec:
        kind = self.kind.currentData()
        batches = self.num_batches.value() or None
        if kind == "demo":
            return DataSpec("demo", "digits", batch_size=self.batch_size.value(), num_batches=batches,
                            split=self.split)
        path = self.path.text().strip()
        if not path:
            raise SourceError("give the path of the data.")
        image = None
        if kind == "images":
            image = image_options(resize=self.resize_spin.value() or None, crop=self.crop_spin.value() or None,
                                  mean=parse_floats(self.mean.text(), "mean"), std=parse_floats(self.std.text(), "std"),
                                  grayscale=self.grayscale.isChecked())
            if not Path(path).expanduser().is_dir():
                raise SourceError(f"{path} is not a folder.")
        elif kind == "tensors" and not Path(path).expanduser().is_file():
            raise SourceError(f"{path} does not exist.")
        return DataSpec(kind, path, batch_size=self.batch_size.value(), num_batches=batches, image=image)


# the data source a new project starts with, per model kind: demo digits only fit the demo model
DEFAULT_DATA_KIND = {"demo": "demo", "hf": "tensors", "timm": "images", "entrypoint": "tensors", "pickle": "tensors"}
TOKEN_MODELS = ("hf",)  # models that usually take token ids (several named inputs)


def data_hint(data_kind: str | None, model_kind: str | None) -> str:
    """What the chosen data source must hold for the chosen model, in a sentence or two."""
    if data_kind == "demo":
        return ("Demo digits are 8x8 images for the demo digits model only." if model_kind not in (None, "demo")
                else "")
    if data_kind == "tensors":
        named = ("Token ids: an .npz whose arrays are named after the forward's arguments, e.g. input_ids and "
                 "attention_mask (int64, [samples, sequence]); an array named 'labels' is kept out of the forward "
                 "and used by top-1 and fine-tuning.")
        single = ("One input: an .npy, or an .npz with an array 'inputs' (or x) and optional 'labels' (or y). Several "
                  "inputs: an .npz whose arrays are named after the forward's arguments (input_ids, attention_mask…).")
        return named if model_kind in TOKEN_MODELS else single
    if data_kind == "images":
        return "Sub-folders are classes (labels for top-1 and fine-tuning); images are resized, cropped and normalised."
    return ""


class CalibrationDataPage(QWizardPage):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTitle("Calibration data")
        self.setSubTitle("Sample inputs the quantizers see while calibrating (a few hundred are usually enough).")
        # what `workbench new` uses too: the data's default batch size, the calibration's default batch count
        self.form = DataSourceForm("train", batch_size=DataSpec.batch_size,
                                   num_batches=DEFAULTS.calibration.num_batches or 0)
        QVBoxLayout(self).addWidget(self.form)

    def initializePage(self) -> None:
        wizard = self.wizard()
        if isinstance(wizard, NewProjectWizard):
            self.form.suit_model(wizard.model_page.kind.currentData())

    def validatePage(self) -> bool:
        try:
            self.form.spec()
        except (SourceError, ValueError) as error:
            _warn(self, "Calibration data", error)
            return False
        return True


class EvaluationDataPage(QWizardPage):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTitle("Evaluation data (optional)")
        self.setSubTitle("Held-out inputs for sensitivity analysis and accuracy; without it the calibration data "
                         "is used.")
        self.use_separate = QCheckBox("Use separate evaluation data")
        self.use_separate.setChecked(True)
        self.form = DataSourceForm("test", batch_size=256, num_batches=0)
        layout = QVBoxLayout(self)
        layout.addWidget(self.use_separate)
        layout.addWidget(self.form)
        self.use_separate.toggled.connect(self.form.setEnabled)
        self.use_separate.toggled.connect(lambda _on: setattr(self, "enabled_chosen", True))
        self.enabled_chosen = False  # the user ticked or unticked it: a later model change keeps it

    def initializePage(self) -> None:
        """Ticked with demo digits for the demo model; for a user's model unticked (the calibration data is then
        used) and, once ticked, the same kind of source as the calibration data."""
        wizard = self.wizard()
        if not isinstance(wizard, NewProjectWizard):
            return
        model_kind = wizard.model_page.kind.currentData()
        if not self.enabled_chosen:
            self.use_separate.blockSignals(True)
            self.use_separate.setChecked(model_kind == "demo")
            self.use_separate.blockSignals(False)
            self.form.setEnabled(self.use_separate.isChecked())
        # the same kind of source as the calibration data (a held-out part of it, usually)
        self.form.suit_model(model_kind, prefer=wizard.calibration_page.form.kind.currentData())

    def spec(self) -> DataSpec | None:
        return self.form.spec() if self.use_separate.isChecked() else None

    def validatePage(self) -> bool:
        try:
            self.spec()
        except (SourceError, ValueError) as error:
            _warn(self, "Evaluation data", error)
            return False
        return True


class FinishPage(QWizardPage):
    """Input shape, metric, name, file and trust."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTitle("Input, metric and project")
        self.setSubTitle("One forward pass checks that the model and the data fit when you press Finish.")
        self.input_shape = QLineEdit()
        self.input_shape.setPlaceholderText("from the data, e.g. 3,224,224 (without the batch)")
        self.metric_box = QComboBox()
        self.metric_box.setEditable(True)
        self.metric_box.addItems(list(BUILTIN_METRICS))
        self.metric_box.setToolTip("; ".join(f"{key}: {label}" for key, label in builtin_metric_labels().items())
                               + "; or a function 'metrics.py:score' (then say which way is better)")
        self.direction = QComboBox()
        self.direction.addItems(["higher is better", "lower is better"])
        self.name = QLineEdit()
        self.name.setPlaceholderText("from the model")
        self.file = QLineEdit()
        self.file.setPlaceholderText("optional: save the new project here (.qwb)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.trust = QCheckBox("Trust this code: let Quant Workbench run the model's and data's Python code")
        self.trust.setToolTip("Entry points and pickles execute code when loaded. Only trust files you know.")
        form = QFormLayout(self)
        form.addRow("Input shape", self.input_shape)
        form.addRow("Metric", self.metric_box)
        form.addRow("Direction", self.direction)
        form.addRow("Project name", self.name)
        form.addRow("Project file", _browse_row(self.file, browse))
        form.addRow(self.trust)
        self._form = form
        self.metric_box.currentTextChanged.connect(self._metric_changed)
        self._metric_changed(self.metric_box.currentText())

    def _metric_changed(self, text: str) -> None:
        self._form.setRowVisible(self.direction, ":" in text)

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save the new project as", "", "Quant Workbench projects (*.qwb)")
        if path:
            self.file.setText(path if path.endswith(".qwb") else path + ".qwb")

    def initializePage(self) -> None:
        wizard = self.wizard()
        needs = isinstance(wizard, NewProjectWizard) and wizard.needs_trust()
        self.trust.setVisible(needs)

    def settings(self) -> dict[str, Any]:
        """The new project's settings from this page's choices (SessionError when they are not valid)."""
        return new_project_settings(metric=self.metric_box.currentText().strip() or DEFAULT_METRIC,
                                    direction="higher" if self.direction.currentIndex() == 0 else "lower")

    def validatePage(self) -> bool:
        try:
            InputSpec.parse_shape(self.input_shape.text())
            from workbench.analysis import get_metric

            setting = self.settings()["metric"]
            if ":" not in setting["name"]:
                get_metric(setting["name"])
        except (SourceError, ValueError) as error:
            _warn(self, "Input and metric", error)
            return False
        return True


class NewProjectWizard(QWizard):
    """Gathers a new project's sources; :meth:`request` gives ``controller.new_project``'s arguments."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("New project")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnStartPage, True)
        self.model_page = ModelPage()
        self.calibration_page = CalibrationDataPage()
        self.evaluation_page = EvaluationDataPage()
        self.finish_page = FinishPage()
        for page in (self.model_page, self.calibration_page, self.evaluation_page, self.finish_page):
            self.addPage(page)
        self.resize(680, 520)
        self.setWindowModality(Qt.WindowModality.WindowModal)

    def needs_trust(self) -> bool:
        try:
            model = self.model_page.spec()
            calibration = self.calibration_page.form.spec()
            evaluation = self.evaluation_page.spec()
        except (SourceError, ValueError):
            return True
        return model.requires_trust or calibration.requires_trust or bool(evaluation and evaluation.requires_trust)

    def request(self) -> dict[str, Any]:
        """``controller.new_project`` keyword arguments (plus ``save_to``, a path or None)."""
        finish = self.finish_page
        save_to = finish.file.text().strip() or None
        settings = finish.settings()
        # the batches chosen here are the project's calibration setting, as `workbench new --num-batches` makes
        # them: calibration (and the Calibrate and Settings dialogs) read that setting, not the data source's cap
        settings["calibration"] = {"num_batches": self.calibration_page.form.num_batches.value() or None}
        return {
            "model": self.model_page.spec(),
            "calibration": self.calibration_page.form.spec(),
            "evaluation": self.evaluation_page.spec(),
            "trust_code": finish.trust.isChecked() and self.needs_trust(),
            "input_shape": InputSpec.parse_shape(finish.input_shape.text()),
            "name": finish.name.text().strip() or None,
            "settings": settings,
            "save_to": save_to,
        }
