"""The session tells what changed (no Qt): one event per change, after it has happened."""
import pytest

from workbench.session import Session, SessionError, SessionEvent
from workbench.sources.data_source import DataSpec
from workbench.sources.model_source import ModelSpec


@pytest.fixture(scope="module")
def session():
    return Session.create(ModelSpec("demo", "digits"),
                          DataSpec("demo", "digits", split="train", batch_size=32, num_batches=1))


def test_each_change_is_told_once_and_refused_changes_not_at_all(session, tmp_path):
    events = []
    disconnect = session.events.connect(events.append)
    try:
        session.set_quantize(["fc"], False)
        session.set_quantize(["fc"], False)  # no change, no event
        session.set_descriptor(["block.conv1"], "input", num_bits=7)
        with pytest.raises(SessionError):
            session.set_setting("fold_bn", "yes")
        session.set_setting("metric", {"name": "top1", "direction": None})
        session.set_setting("rules", {**session.project.settings["rules"], "maxpool": False})
        session.calibrate(method="max", num_batches=1)
        path = session.save(tmp_path / "events.qwb")
        assert [(e.kind, e.data) for e in events] == [
            (SessionEvent.LAYERS, {"names": ["fc"]}),
            (SessionEvent.LAYERS, {"names": ["block.conv1"]}),
            (SessionEvent.SETTINGS, {"keys": ["metric"]}),
            (SessionEvent.SETTINGS, {"keys": ["rules"]}),
            (SessionEvent.LAYERS, {"names": list(session.project.layers)}),
            (SessionEvent.CALIBRATION, {}),
            (SessionEvent.SAVED, {"path": str(path)}),
        ]
        assert not session.dirty
    finally:
        disconnect()
    session.set_quantize(["fc"], True)
    assert len(events) == 7  # disconnected: told no more


def test_a_failing_listener_neither_stops_the_change_nor_the_other_listeners(session, caplog):
    heard = []

    def broken(event):
        raise RuntimeError("listener bug")

    session.events.connect(broken)
    session.events.connect(heard.append)
    try:
        assert session.set_quantize(["fc"], not session.project.layers["fc"].quantize) == ["fc"]
    finally:
        session.events.disconnect(broken)
        session.events.disconnect(heard.append)
    assert [e.kind for e in heard] == [SessionEvent.LAYERS] and "listener bug" in caplog.text
