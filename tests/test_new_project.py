"""The CLI's 'new' and the GUI's wizard read a new project's choices the same way."""
import pytest

from workbench.project.settings import DEFAULTS
from workbench.session import SessionError
from workbench.session.new_project import DEFAULT_IMAGE_OPTIONS, factory_arguments, image_options, new_project_settings
from workbench.sources.data_source import ImageOptions


@pytest.mark.parametrize("text", ["num_classes=10,pretrained=false,name=tiny",
                                  "num_classes: 10, pretrained: false, name: tiny",
                                  '{"num_classes": 10, "pretrained": false, "name": "tiny"}'])
def test_factory_arguments_in_either_form_mean_the_same(text):
    assert factory_arguments(text) == {"num_classes": 10, "pretrained": False, "name": "tiny"}


def test_bad_factory_arguments_say_what_was_expected():
    assert factory_arguments("") == {} and factory_arguments(None) == {}
    with pytest.raises(SessionError, match="name=value pairs or a YAML/JSON mapping"):
        factory_arguments("[1, 2]")


def test_image_defaults_are_the_data_sources_own():
    assert DEFAULT_IMAGE_OPTIONS == ImageOptions()
    assert image_options() == ImageOptions()
    assert image_options(grayscale=True, crop=28) == ImageOptions(crop=28, mean=(0.0,), std=(1.0,), grayscale=True)
    assert image_options(mean=(0.5, 0.5, 0.5)).std == (1.0, 1.0, 1.0)


def test_settings_keep_a_direction_only_for_a_user_metric():
    assert new_project_settings() == {}
    assert new_project_settings(metric="top1", direction="lower") == {"metric": {"name": "top1", "direction": None}}
    assert new_project_settings(metric="m.py:f", direction="lower") == {"metric": {"name": "m.py:f",
                                                                                   "direction": "lower"}}
    with pytest.raises(SessionError, match="'higher' or 'lower'"):
        new_project_settings(metric="m.py:f", direction="up")


def test_the_wizard_asks_for_what_the_cli_would_create(qtbot, tmp_path):
    pytest.importorskip("PySide6")
    from workbench import cli
    from workbench.app.wizard import DataSourceForm, NewProjectWizard
    from workbench.cli.common import data_spec

    form = DataSourceForm("train")
    qtbot.addWidget(form)
    form.kind.setCurrentIndex(form.kind.findData("images"))
    form.path.setText(str(tmp_path))
    args = cli.build_parser().parse_args(["new", "p.qwb", "--model", "demo:digits", "--data", str(tmp_path),
                                          "--mean", "0", "0", "0"])
    assert form.spec().image == data_spec(str(tmp_path), args, 32).image == DEFAULT_IMAGE_OPTIONS

    wizard = NewProjectWizard()
    qtbot.addWidget(wizard)
    wizard.model_page.kind.setCurrentIndex(wizard.model_page.kind.findData("entrypoint"))
    wizard.model_page.entrypoint.setText("net.py:make")
    wizard.model_page.kwargs.setText("width=8,bias=false")
    wizard.finish_page.metric_box.setCurrentText("top1")
    request = wizard.request()
    assert request["model"].kwargs == {"width": 8, "bias": False}
    assert request["settings"] == {**new_project_settings(metric="top1"),
                                   "calibration": {"num_batches": DEFAULTS.calibration.num_batches}}
