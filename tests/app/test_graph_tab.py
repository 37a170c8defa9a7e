"""The graph tab: netron served on localhost, the request filter, consent, expiry, the preview export.

The QtWebEngine test renders netron offscreen (about two seconds); it is skipped where QtWebEngine
cannot be imported. Everything else runs in browser mode, without Chromium.
"""
import json
import socket
import urllib.error
import urllib.request
from datetime import timedelta

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("netron")

from PySide6.QtCore import QCoreApplication, QUrl  # noqa: E402

from workbench.app import graph_tab as graph_module  # noqa: E402
from workbench.app.graph_tab import (  # noqa: E402
    PAGE_STATE_JS,
    GraphTab,
    is_local_url,
    make_interceptor,
    netron_build_date,
    netron_expired,
    prepare_application,
    webengine_status,
)
from workbench.sources.data_source import DataSpec  # noqa: E402
from workbench.sources.model_source import ModelSpec  # noqa: E402

if QCoreApplication.instance() is None:  # collection runs before pytest-qt makes the QApplication
    prepare_application()


@pytest.fixture
def tiny_onnx(tmp_path):
    """A one-node ONNX file (netron serves any file; no export needed)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read()


def test_local_urls_and_netron_age():
    assert is_local_url("http://127.0.0.1:8080/index.html") and is_local_url("http://localhost/x.js")
    assert is_local_url("data:image/png;base64,AAAA") and is_local_url(QUrl("blob:http://127.0.0.1/1"))
    for outside in ("https://analytics.google.com/g/collect?v=2", "https://ipinfo.io/json",
                    "http://127.0.0.1.example.com/", "file:///etc/passwd", "ftp://localhost/x"):
        assert not is_local_url(outside), outside
    built = netron_build_date()
    assert built is not None  # netron's page carries its build date, which it counts 180 days from
    assert not netron_expired(now=built + timedelta(days=30))
    assert netron_expired(now=built + timedelta(days=181))


def test_netron_serves_the_file_on_localhost_and_stops(controller, qtbot, tiny_onnx, tmp_path, monkeypatch):
    tab = GraphTab(controller, embed=False)
    qtbot.addWidget(tab)
    assert tab.page_state == "empty" and "No exported ONNX yet" in tab.placeholder.text()
    assert tab.show_file(tiny_onnx)
    url = tab.url
    assert url.startswith("http://127.0.0.1:") and tab.page_state == "browser"
    status, body = get(url)
    assert status == 200 and b"netron" in body.lower()
    status, data = get(url + "data/tiny.onnx")
    assert status == 200 and data == tiny_onnx.read_bytes()
    assert url in tab.placeholder.text() and "tiny.onnx" in tab.file_label.text()

    opened = []
    monkeypatch.setattr(graph_module.QDesktopServices, "openUrl", lambda target: opened.append(target) or True)
    assert tab.open_in_browser() and opened[0].toString() == url

    # another file: the first server stops, the new one serves the new file
    other = tmp_path / "other.onnx"
    other.write_bytes(tiny_onnx.read_bytes())
    tab.show_file(other)
    assert tab.url != url
    with pytest.raises((urllib.error.URLError, ConnectionError, socket.timeout)):
        get(url, timeout=2.0)
    assert get(tab.url + "data/other.onnx")[1] == other.read_bytes()

    second = tab.url
    tab.shutdown()
    assert not tab.server.running
    with pytest.raises((urllib.error.URLError, ConnectionError, socket.timeout)):
        get(second, timeout=2.0)

    with qtbot.waitSignal(controller.error) as blocker:
        tab.show_file(tmp_path / "missing.onnx")
    assert "missing.onnx" in blocker.args[1] and tab.page_state == "error"


def test_the_request_interceptor_blocks_outside_hosts(qtbot):
    if not webengine_status()[0]:
        pytest.skip(webengine_status()[1])

    class Request:  # what QtWebEngine passes: the URL, and block()
        def __init__(self, url):
            self.url, self.blocked = QUrl(url), False

        def requestUrl(self):  # noqa: N802
            return self.url

        def block(self, flag):
            self.blocked = flag

    interceptor = make_interceptor()
    outside, local = Request("https://analytics.google.com/g/collect?v=2"), Request("http://127.0.0.1:5000/index.js")
    interceptor.interceptRequest(outside)
    interceptor.interceptRequest(local)
    assert outside.blocked and not local.blocked
    assert interceptor.blocked == ["https://analytics.google.com/g/collect?v=2"]


def test_the_page_state_is_read_and_expiry_offers_the_browser(controller, qtbot, tiny_onnx):
    tab = GraphTab(controller, embed=False)
    qtbot.addWidget(tab)
    tab.show_file(tiny_onnx)
    tab._page_checked(json.dumps({"state": "expired", "message": "Please update to the newest version."}))
    assert tab.page_state == "expired" and not tab.notice.isHidden()
    assert "Please update" in tab.notice_label.text() and "pip install -U netron" in tab.notice_label.text()
    opened = []
    tab.open_in_browser = lambda: opened.append(True)  # the notice's link
    tab.notice_label.linkActivated.emit("browser")
    assert opened == [True]
    tab._page_checked(json.dumps({"state": "error", "message": "Unsupported file <b>"}))
    assert tab.page_state == "error" and "Unsupported file &lt;b&gt;" in tab.notice_label.text()


def test_embedded_netron_renders_with_consent_and_stays_offline(controller, qtbot, tiny_onnx):
    if not webengine_status()[0]:
        pytest.skip(webengine_status()[1])
    tab = GraphTab(controller)
    qtbot.addWidget(tab)
    tab.resize(900, 600)
    tab.show()
    assert tab.embedded is None and tab.view is None  # decided, and Chromium started, on the first load
    tab.show_file(tiny_onnx)
    qtbot.waitUntil(lambda: tab.page_state not in ("loading", "consent"), timeout=40000)
    assert tab.embedded and tab.view is not None
    expected = "expired" if netron_expired() else "graph"
    assert tab.page_state == expected, tab.page_info
    assert ("consent", "127.0.0.1") in tab.cookies_set  # set for the localhost origin before loading
    assert "consent=" in tab.page_info.get("cookie", "")  # and the page sees it: no cookie banner
    if expected == "graph":
        assert tab.page_info["nodes"] >= 1

    # whatever the page asks for outside localhost is blocked
    tab._page.runJavaScript("fetch('https://example.com/phone-home').catch(function () {});")
    qtbot.waitUntil(lambda: any("example.com" in url for url in tab.blocked_requests), timeout=10000)

    # the state script on a page that shows netron's expiry message
    answers = []
    tab._page.setHtml("<body class='notification'><div id='message-text'>Please update to the newest version."
                      "</div><button id='message-button'>Update</button></body>", QUrl(tab.url))

    def shows_expired():
        tab._page.runJavaScript(PAGE_STATE_JS, 0, answers.append)
        return bool(answers) and json.loads(answers[-1])["state"] == "expired"

    qtbot.waitUntil(shows_expired, timeout=10000)
    tab.shutdown()
    assert tab.view is None and not tab.server.running


def test_export_preview_keeps_the_project_settings_and_exports_are_followed(controller, qtbot, tmp_path):
    with qtbot.waitSignal(controller.session_changed, timeout=60000):
        controller.new_project(ModelSpec("demo", "digits"),
                               DataSpec("demo", "digits", split="train", batch_size=64, num_batches=2))
    session = controller.session
    tab = GraphTab(controller, embed=False)
    qtbot.addWidget(tab)
    with qtbot.waitSignal(controller.calibration_changed, timeout=60000):
        controller.calibrate(method="max")
    before = dict(session.project.settings["export"])
    finished = []
    controller.export_finished.connect(finished.append)
    assert tab.export_preview()
    qtbot.waitUntil(lambda: tab.path is not None and tab.path.name.endswith(".preview.qdq.onnx"), timeout=60000)
    preview = tab.path
    assert get(tab.url + "data/" + preview.name)[1] == preview.read_bytes()
    assert session.project.settings["export"] == before and session.project.exports == [] and finished == []

    target = tmp_path / "digits.qdq.onnx"
    with qtbot.waitSignal(controller.export_finished, timeout=60000):
        controller.export(target)
    assert tab.path == target.resolve()
    tab.shutdown()
    assert not preview.exists()  # the preview folder goes with the tab


def test_a_graph_netron_draws_without_nodes_is_explained_not_left_blank(controller, qtbot, tiny_onnx, tmp_path):
    """A file whose graph is written in two parts (valid protobuf: onnx reads the node, netron keeps only the second
    part and draws nothing, as it did for this app's exports over 8 MB): the tab says why the canvas is empty."""
    if not webengine_status()[0]:
        pytest.skip(webengine_status()[1])
    if netron_expired():
        pytest.skip("this netron refuses to draw graphs (it asks to be updated)")
    import numpy as np
    import onnx
    from onnx import numpy_helper

    part = onnx.ModelProto()
    part.graph.initializer.append(numpy_helper.from_array(np.zeros(4, np.float32), "unused"))
    split = tmp_path / "split.onnx"
    split.write_bytes(tiny_onnx.read_bytes() + part.SerializeToString())
    assert [n.op_type for n in onnx.load(str(split)).graph.node] == ["Relu"]  # protobuf merges the parts
    tab = GraphTab(controller)
    qtbot.addWidget(tab)
    tab.resize(900, 600)
    tab.show()
    tab.show_file(split)
    qtbot.waitUntil(lambda: tab.page_state not in ("loading", "consent"), timeout=40000)
    assert tab.page_state == "blank", tab.page_info
    assert tab.page_info["nodes"] == 0 and not tab.notice.isHidden()
    assert "drew no nodes for split.onnx" in tab.notice_label.text()
    tab.show_file(tiny_onnx)  # the same tab on a whole file: drawn, the notice gone
    qtbot.waitUntil(lambda: tab.page_state not in ("loading", "consent"), timeout=40000)
    assert tab.page_state == "graph" and tab.notice.isHidden()
    tab.shutdown()
