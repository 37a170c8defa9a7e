"""The graph tab: the exported QDQ ONNX (or a preview of the current state) drawn by netron.

netron is served on localhost (``netron.start(path, address=("127.0.0.1", port), browse=False)``,
a daemon thread in this process) and shown:

* embedded in a QWebEngineView when QtWebEngine imports and its renderer runs. The view gets its own
  off-the-record profile so that nothing persists, with
  - the ``consent`` cookie set for the localhost origin before loading: otherwise netron covers the
    graph with a cookie banner (and first asks ipinfo.io where the user is);
  - a request interceptor that blocks every request to a host other than localhost/127.0.0.1: after
    consent netron sends analytics to Google, and a desktop tool must not phone home;
  - a check of the page after loading (``runJavaScript``): netron builds refuse to draw 180 days
    after their build date and show "Please update to the newest version." instead; the tab then
    says so and offers the browser, as it does when the renderer fails;
* otherwise in the system browser, by the "Open in browser" button.

QtWebEngine is imported lazily, so the app starts (and this tab works in browser mode) without it.
The netron server (:mod:`workbench.app.netron_server`) is stopped when another file is shown and when
the tab goes away; the local-only browser pieces are :mod:`workbench.app.webengine`.

Selection is linked both ways (:mod:`workbench.app.graph_selection`): the tree's selection selects and reveals the
layers' nodes in netron; a click on a node emits ``node_clicked`` with the names netron selected.

A file given while the tab is hidden loads at once in a view parked as a 1x1 child of the window (Chromium draws
in the background; no blackout on the first switch); it moves into the tab, revealing the selection, when shown.
"""
from __future__ import annotations

import html
import json
import logging
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from workbench.app.controller import Controller
from workbench.app.graph_selection import INSTALL_JS, NODES_JS, SELECTED_JS, clicked_names, nodes_of_layers, select_js
from workbench.app.netron_server import (
    NETRON_MAX_AGE_DAYS,
    NetronServer,
    free_port,
    netron_build_date,
    netron_expired,
    netron_version,
)
from workbench.app.webengine import (
    consent_cookie,
    is_local_url,
    make_interceptor,
    prepare_application,
    webengine_classes,
    webengine_status,
)

logger = logging.getLogger(__name__)

__all__ = ["GraphTab", "NetronServer", "prepare_application", "webengine_status", "is_local_url",
           "netron_build_date", "netron_expired", "free_port", "make_interceptor", "PAGE_STATE_JS",
           "NETRON_MAX_AGE_DAYS"]

LOAD_TIMEOUT_S = 30.0
# A graph to show while the tab is hidden is drawn in the background this long after the window is up (the
# window paints first, a project opens at full speed), so that the first switch to the tab finds it drawn.
# Off (False) nothing starts Chromium before the tab is opened; the GUI tests turn it off but in the test of it.
PRELOAD = True
PRELOAD_DELAY_MS = 1000
REVEAL_DELAY_MS = 50  # ms after the tab shows, when the view has its size
POLL_INTERVAL_MS = 300

# What netron's page shows, read from its DOM: the body's class says which screen is up
# ("welcome spinner" while loading, "default" with a graph, "notification"/"alert" with a message).
PAGE_STATE_JS = r"""
(function () {
  var body = document.body;
  if (!body) { return JSON.stringify({state: 'loading', message: '', nodes: 0, classes: ''}); }
  var classes = body.className || '';
  var box = document.getElementById('message-text');
  var message = box ? (box.innerText || '') : '';
  var nodes = document.querySelectorAll('#canvas .node').length;
  var showing = /\b(notification|alert)\b/.test(classes);
  var state = 'loading';
  if (showing && /please update/i.test(message)) { state = 'expired'; }
  else if (showing && /cookies/i.test(message)) { state = 'consent'; }
  else if (/\balert\b/.test(classes)) { state = 'error'; }
  else if (nodes > 0) { state = 'graph'; }
  // netron shows "default" once it has drawn: with no node drawn, it read a graph holding none
  else if (/\bdefault\b/.test(classes)) { state = 'blank'; }
  return JSON.stringify({state: state, message: message, nodes: nodes, classes: classes,
                         cookie: document.cookie});
})()
"""


# ----- the tab -------------------------------------------------------------------------------------


class GraphTab(QWidget):
    """netron over the latest export, a preview, or any ONNX file.

    ``page_state`` is what the user sees: "empty" (nothing to show), "loading", "graph", "blank" (netron drew
    no node: an empty canvas, which the notice explains), "expired"
    (netron's "Please update"), "error", or "browser" (served for the system browser only).
    ``state_changed(state, message)`` follows it.
    """

    state_changed = Signal(str, str)
    node_clicked = Signal(list)  # the ONNX node names selected by a click in netron
    graph_selection_changed = Signal(list)  # the node names selected in netron, by the app or by a click

    def __init__(self, controller: Controller, parent: QWidget | None = None, *, embed: bool | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.server = NetronServer()
        self.page_state = "empty"
        self.page_info: dict[str, Any] = {}
        self.cookies_set: list[tuple[str, str]] = []   # (name, domain) of cookies the view's store took
        # None until the first load decides: importing QtWebEngine costs ~150 ms, which the app's
        # start should not pay for a tab that may never be opened
        self.embedded: bool | None = False if embed is False else None
        self.webengine_reason = "embedding turned off" if embed is False else ""
        self.view: Any = None
        self.profile: Any = None
        self.interceptor: Any = None
        self._page: Any = None
        self._load_id = 0
        self._load_started = 0.0
        self._pending_load = False
        self._preview_dir: Path | None = None
        self.graph_nodes: list[str] = []  # the ONNX node names netron drew (once the graph is up)
        self.graph_selection: list[str] = []  # the node names selected in netron, as last known
        self._from_graph = False  # a click is being passed to the tree: its echo must not reselect
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_INTERVAL_MS)
        self._poll.timeout.connect(self._check_page)
        self._build()
        # stop serving when the tab goes away, even if nobody calls shutdown()
        self._finalizer = weakref.finalize(self, _cleanup, self.server, None)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self.shown_digest: str | None = None  # the project state the graph shown was exported from (None: unknown)
        controller.session_changed.connect(self._on_session_changed)
        controller.export_finished.connect(self._on_export_finished)
        controller.busy_changed.connect(self._busy_changed)
        controller.selection_changed.connect(self._selection_from_controller)
        for signal in (controller.layers_changed, controller.calibration_changed, controller.settings_changed):
            signal.connect(self.update_freshness)
        self._on_session_changed()

    # ----- construction ---------------------------------------------------------------------------

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        bar = QHBoxLayout()
        self.file_label = QLabel("No ONNX file")
        self.file_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.preview_button = QPushButton("Export preview")
        self.preview_button.setToolTip("Export the current state to a temporary QDQ ONNX file and show it "
                                       "(the project's export settings stay as they are)")
        self.preview_button.clicked.connect(self.export_preview)
        self.open_button = QPushButton("Open ONNX…")
        self.open_button.clicked.connect(self._choose_file)
        self.reload_button = QPushButton("Reload")
        self.reload_button.clicked.connect(self.reload)
        self.browser_button = QPushButton("Open in browser")
        self.browser_button.setToolTip("Open the local netron page in the system browser")
        self.browser_button.clicked.connect(self.open_in_browser)
        bar.addWidget(self.file_label, 1)
        # an export of an earlier state says so: the graph is not what exporting now would write
        self.stale_label = QLabel("⚠ out of date")
        self.stale_label.setObjectName("staleMark")
        self.stale_label.setStyleSheet("color: #b9770e; font-weight: bold;")
        self.stale_label.setToolTip("The project changed since this graph was exported (layers, descriptors, "
                                    "calibration or settings): Export preview shows the current state.")
        self.stale_label.hide()
        bar.addWidget(self.stale_label)
        for button in (self.preview_button, self.open_button, self.reload_button, self.browser_button):
            bar.addWidget(button)
        layout.addLayout(bar)

        # a message bar for what the user should know (expired netron, no QtWebEngine, errors)
        self.notice = QFrame()
        self.notice.setFrameShape(QFrame.Shape.StyledPanel)
        self.notice.setStyleSheet("QFrame { background: #fff4d6; border: 1px solid #e0c060; border-radius: 3px; }"
                                  "QLabel { border: none; color: #3a3000; }")
        notice_layout = QHBoxLayout(self.notice)
        notice_layout.setContentsMargins(8, 4, 8, 4)
        self.notice_label = QLabel()
        self.notice_label.setWordWrap(True)
        self.notice_label.setTextFormat(Qt.TextFormat.RichText)
        self.notice_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.notice_label.setOpenExternalLinks(False)
        self.notice_label.linkActivated.connect(lambda _: self.open_in_browser())
        notice_layout.addWidget(self.notice_label, 1)
        self.notice.hide()
        layout.addWidget(self.notice)

        self.stack = QStackedWidget()
        self.placeholder = QLabel()
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.placeholder.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.placeholder.linkActivated.connect(lambda _: self.open_in_browser())  # the only link: netron's URL
        self.stack.addWidget(self.placeholder)
        layout.addWidget(self.stack, 1)
        self._set_placeholder()

    def _ensure_view(self) -> bool:
        """Create the web view, its private profile, the interceptor and the page (once)."""
        if self.view is not None:
            return True
        if self.embedded is None:
            available, self.webengine_reason = webengine_status()
            self.embedded = available
        if not self.embedded:
            return False
        try:
            from PySide6.QtWebEngineCore import QWebEngineProfile, QWebEngineSettings
            from PySide6.QtWebEngineWidgets import QWebEngineView
            classes = webengine_classes()
            # no storage name: off the record, so cookies and cache vanish with the tab
            self.profile = QWebEngineProfile()
            self.interceptor = classes["interceptor"](self.profile)
            self.profile.setUrlRequestInterceptor(self.interceptor)
            self.profile.cookieStore().cookieAdded.connect(self._cookie_added)
            self.view = QWebEngineView()
            self._page = classes["page"](self.profile, self.view)
            self._page.blocked_navigation.connect(
                lambda url: self.controller.log.emit("info", f"graph view: not following a link to {url} "
                                                             "(the app stays offline; open it in a browser)"))
            self._page.loadFinished.connect(self._load_finished)
            self._page.renderProcessTerminated.connect(self._renderer_died)
            self._page.console_message.connect(self._console_message)
            settings = self._page.settings()
            settings.setAttribute(QWebEngineSettings.WebAttribute.LocalContentCanAccessRemoteUrls, False)
            self.view.setPage(self._page)
        except Exception as error:  # noqa: BLE001 - a broken QtWebEngine: fall back to the browser
            self._drop_view()
            self.embedded = False
            self.webengine_reason = f"QtWebEngine failed to start ({type(error).__name__}: {error})"
            logger.warning(self.webengine_reason)
            return False
        return True

    # ----- what is shown --------------------------------------------------------------------------

    @property
    def url(self) -> str | None:
        return self.server.url

    @property
    def path(self) -> Path | None:
        return self.server.path

    def show_file(self, path: str | Path) -> bool:
        """Serve ``path`` with netron and show it (embedded, or ready for the browser)."""
        try:
            url = self.server.start(path)
        except Exception as error:  # noqa: BLE001 - a missing file, no netron, no port: tell the user
            self.controller.error.emit("Graph view", f"Could not serve {path} with netron: {error}", "")
            self._set_state("error", str(error))
            return False
        self.file_label.setText(f"<b>{Path(path).name}</b> &nbsp; <span style='color:gray'>{Path(path).parent}"
                                f" · netron {netron_version()} at {url}</span>")
        self.file_label.setToolTip(str(Path(path).resolve()))
        self._load_id += 1
        if self.embedded is False:
            self._show_browser_mode()
            return True
        self._pending_load = True
        self.graph_nodes, self.graph_selection = [], []
        if self.isVisible():
            self._load()
        else:
            self._set_state("loading", "")  # QtWebEngine starts when the tab is first shown, or on preload
            self.preload_soon()
        return True

    def _window_shown(self) -> bool:
        host = self.window()
        return host is not self and host.isVisible()

    def _parked(self) -> bool:
        """Whether the view exists but sits outside the tab (drawn in the background, tab not opened yet)."""
        return self.view is not None and self.stack.indexOf(self.view) < 0

    def preload_soon(self) -> None:
        """Draw the graph waiting to be shown in the background, :data:`PRELOAD_DELAY_MS` from now (see
        :meth:`warm_up`); the main window calls it when shown, :meth:`show_file` when given a file."""
        if PRELOAD and self._pending_load and self._window_shown() and (self.view is None or self._parked()):
            QTimer.singleShot(PRELOAD_DELAY_MS, self, self.warm_up)

    def _load(self) -> None:
        self._pending_load = False
        if self.url is None:
            return
        if not self._ensure_view():
            self._show_browser_mode()
            return
        origin = QUrl(self.url)
        self.profile.cookieStore().setCookie(consent_cookie(origin), origin)
        self._place_view()
        self._set_state("loading", "")
        self._load_started = time.monotonic()
        self._page.load(QUrl(self.url))
        self._poll.start()

    def _place_view(self) -> None:
        """The view in the tab when the tab is shown; else parked, 1x1 and behind everything, in the window."""
        if self.view is None:
            return
        if self.isVisible():
            if self.stack.indexOf(self.view) < 0:
                self.stack.addWidget(self.view)
            self.stack.setCurrentWidget(self.view)
        elif self.stack.indexOf(self.view) < 0 and self.view.parentWidget() is not self.window():
            self.view.setParent(self.window())
            self.view.setGeometry(0, 0, 1, 1)
            self.view.lower()
            self.view.show()

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if self._pending_load:
            QTimer.singleShot(0, self._load)
        elif self.view is not None and self.stack.indexOf(self.view) < 0 and self.page_state != "empty":
            self._place_view()  # a graph loaded in the background: shown now, already drawn
        if self.view is not None and self.page_state == "graph":  # netron scrolled at the size it had (a parked
            QTimer.singleShot(REVEAL_DELAY_MS, self._reveal_selection)  # 1x1 view, a hidden tab): again at this one

    def _reveal_selection(self) -> None:
        if self.isVisible() and self.controller.selection:
            self.select_layers(list(self.controller.selection))

    def warm_up(self) -> None:
        """Start a pending load while the tab is hidden, in a view parked in the window, so that the graph is
        drawn (and the window has the GPU surface QtWebEngine needs) before the tab is first opened.

        Only before the tab was ever opened: afterwards the view lives in the tab and a hidden tab loads when
        shown again. Nothing happens with :data:`PRELOAD` off, with no file to show, or with the window hidden.
        """
        if not (PRELOAD and self._pending_load and self._window_shown()):
            return
        if self.isVisible() or self.view is None or self._parked():
            self._load()

    def reload(self) -> None:
        if self.path is not None:
            self.show_file(self.path)

    def clear(self) -> None:
        """Show nothing and stop serving."""
        self._poll.stop()
        self._load_id += 1
        self.server.stop()
        self._pending_load = False
        self.graph_nodes, self.graph_selection = [], []
        if self._page is not None:
            self._page.setHtml("")
        self.file_label.setText("No ONNX file")
        self._set_placeholder()
        self._set_state("empty", "")

    def _set_placeholder(self, text: str | None = None) -> None:
        self.placeholder.setText(text or (
            "<p style='font-size:14px'>No exported ONNX yet.</p><p style='color:gray'>Export the project "
            "(toolbar), or <b>Export preview</b> to see the QDQ graph of the current state.</p>"))
        self.stack.setCurrentWidget(self.placeholder)

    def _show_browser_mode(self) -> None:
        expired = ""
        if netron_expired():  # the browser gets the same page, so the same refusal
            expired = (f"<p style='color:#a05000'>netron {netron_version()} is more than {NETRON_MAX_AGE_DAYS} days "
                       "old and its page will ask you to update it: <code>pip install -U netron</code>.</p>")
        self._set_placeholder(
            f"<p style='font-size:14px'>netron serves <b>{self.path.name if self.path else ''}</b> at "
            f"<a href='{self.url}'>{self.url}</a></p><p style='color:gray'>{html.escape(self.webengine_reason)}: "
            f"the graph opens in your browser (<b>Open in browser</b>).</p>{expired}")
        self._set_state("browser", self.webengine_reason)

    def _set_state(self, state: str, message: str) -> None:
        self.page_state = state
        notice = ""
        if state == "expired":
            built = netron_build_date()
            age = f", built {built:%Y-%m-%d}" if built else ""
            notice = (f"<b>netron {netron_version()}{age} refuses to draw graphs more than {NETRON_MAX_AGE_DAYS} "
                      "days after its build date</b> (it shows “Please update”). Update it with "
                      "<code>pip install -U netron</code>, then Reload (or restart the app); or "
                      "<a href='browser'>open the page in your browser</a> (the same page: updating is the fix).")
        elif state == "error" and message:
            notice = (f"<b>netron could not show the file:</b> {html.escape(message)} &nbsp; "
                      "<a href='browser'>Open in browser</a>")
        elif state == "blank":
            name = self.path.name if self.path else "the file"
            notice = (f"<b>netron {netron_version()} drew no nodes for {html.escape(name)}:</b> the graph it read "
                      "from the file is empty. ONNX files whose graph netron cannot read in full (such as exports "
                      "of this app before its fix for models over 8 MB, whose graph was written in several parts) "
                      "look like this: export again to redraw it. onnxruntime and TensorRT read such files as "
                      "they are. &nbsp; <a href='browser'>Open in browser</a>")
        elif state == "timeout":
            notice = (f"netron did not finish drawing within {LOAD_TIMEOUT_S:.0f} s. "
                      "<a href='browser'>Open in browser</a>")
        elif state == "consent":
            notice = ("netron asks for cookie consent (the app could not set it); its analytics requests are "
                      "blocked either way.")
        self.notice_label.setText(notice)
        self.notice.setVisible(bool(notice))
        self.state_changed.emit(state, message)

    # ----- page checks ----------------------------------------------------------------------------

    def _load_finished(self, ok: bool) -> None:
        if not ok and self.page_state == "loading":
            self._poll.stop()
            self._set_state("error", f"the page at {self.url} did not load")

    def _check_page(self) -> None:
        if self._page is None or self.page_state not in ("loading", "consent"):
            self._poll.stop()
            return
        if time.monotonic() - self._load_started > LOAD_TIMEOUT_S:
            self._poll.stop()
            self._set_state("timeout", "")
            return
        load_id = self._load_id
        tab = weakref.ref(self)

        def answered(result: Any) -> None:
            # the callback may come after the tab or the load it checked is gone
            me = tab()
            if me is not None and me._load_id == load_id:
                me._page_checked(result)

        self._page.runJavaScript(PAGE_STATE_JS, 0, answered)

    def _page_checked(self, result: Any) -> None:
        try:
            info = json.loads(result) if isinstance(result, str) else {}
        except ValueError:
            info = {}
        self.page_info = info
        state = info.get("state", "loading")
        if state in ("graph", "blank", "expired", "error"):
            self._poll.stop()
            self._set_state(state, str(info.get("message", "")))
            if state == "graph":
                self._install_selection()
        elif state == "consent" and self.page_state != "consent":
            # the cookie did not take: the user may accept netron's banner; its analytics stay blocked
            self._set_state("consent", str(info.get("message", "")))

    # ----- selection linked with the tree ------------------------------------------------------------

    def _install_selection(self, attempt: int = 0) -> None:
        """Hook netron's page (click reports, selecting by name), then show the controller's selection.

        netron sets its view's target a moment after the page shows the graph: until the helper finds a drawn
        node, it is tried again every poll interval, up to the load timeout.
        """
        if self._page is None:
            return
        load_id = self._load_id
        tab = weakref.ref(self)

        def installed(count: Any) -> None:
            me = tab()
            if me is None or me._page is None or me._load_id != load_id:
                return
            if isinstance(count, (int, float)) and count > 0:
                me._page.runJavaScript(NODES_JS, 0, lambda result: me_nodes_read(result))
            elif attempt * POLL_INTERVAL_MS < LOAD_TIMEOUT_S * 1000:
                QTimer.singleShot(POLL_INTERVAL_MS, me, lambda: me_install(attempt + 1))

        def me_nodes_read(result: Any) -> None:
            me = tab()
            if me is not None:
                me._nodes_read(result, load_id)

        def me_install(next_attempt: int) -> None:
            me = tab()
            if me is not None and me._load_id == load_id:
                me._install_selection(next_attempt)

        self._page.runJavaScript(INSTALL_JS, 0, installed)

    def _nodes_read(self, result: Any, load_id: int) -> None:
        if load_id != self._load_id:
            return
        try:
            names = json.loads(result) if isinstance(result, str) else []
        except ValueError:
            names = []
        self.graph_nodes = [str(name) for name in names]
        if self.controller.selection:
            self.select_layers(self.controller.selection)

    def select_layers(self, layers: list[str]) -> list[str]:
        """Select (and scroll to) the nodes of ``layers`` in netron; returns their names (none: selection cleared)."""
        names = nodes_of_layers(self.graph_nodes, layers)
        if self._page is not None and self.graph_nodes and self.page_state == "graph":
            self._page.runJavaScript(select_js(names))
            self._set_graph_selection(names)
        return names

    def _selection_from_controller(self, layers: list[str]) -> None:
        if not self._from_graph:
            self.select_layers(list(layers))

    def _console_message(self, message: str) -> None:
        names = clicked_names(message)
        if names is None:
            return
        self._set_graph_selection(names)
        self._from_graph = True
        try:
            self.node_clicked.emit(names)
        finally:
            self._from_graph = False

    def _set_graph_selection(self, names: list[str]) -> None:
        if names != self.graph_selection:
            self.graph_selection = list(names)
            self.graph_selection_changed.emit(list(names))

    def read_graph_selection(self, callback: Any) -> None:
        """Ask the page which nodes netron shows selected; ``callback(names)`` gets them (tests, screenshots)."""
        if self._page is None:
            callback([])
            return
        self._page.runJavaScript(SELECTED_JS, 0, lambda result: callback(json.loads(result) if
                                                                          isinstance(result, str) else []))

    def _renderer_died(self, status: Any, code: int) -> None:
        if self._page is None:
            return
        self._poll.stop()
        self.embedded = False
        self.webengine_reason = f"the QtWebEngine renderer stopped ({getattr(status, 'name', status)}, code {code})"
        self.controller.log.emit("warning", f"graph view: {self.webengine_reason}; showing netron in the browser")
        self._show_browser_mode()

    def _cookie_added(self, cookie: Any) -> None:
        self.cookies_set.append((bytes(cookie.name().data()).decode(errors="replace"), cookie.domain()))

    @property
    def blocked_requests(self) -> list[str]:
        """URLs the view's interceptor refused (netron's analytics, for instance)."""
        return list(self.interceptor.blocked) if self.interceptor is not None else []

    # ----- actions --------------------------------------------------------------------------------

    def open_in_browser(self) -> bool:
        """Open the local netron page in the system browser (the tab serves it even without QtWebEngine)."""
        if self.url is None:
            self.controller.error.emit("Open in browser", "No ONNX file is shown: export or open one first.", "")
            return False
        if not QDesktopServices.openUrl(QUrl(self.url)):
            self.controller.error.emit("Open in browser", f"No browser could be started: open {self.url} "
                                                          "yourself (it is served while this tab is open).", "")
            return False
        return True

    def export_preview(self) -> bool:
        """Export the current state to a temporary file (the project's export settings stay) and show it."""
        if self.controller.session is None:
            self.controller.error.emit("Export preview", "Create or open a project first.", "")
            return False
        if self._preview_dir is None or not self._preview_dir.is_dir():
            self._preview_dir = Path(tempfile.mkdtemp(prefix="workbench-preview-"))
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _cleanup, self.server, self._preview_dir)
        stem = self.controller.session.project.name or "model"
        target = self._preview_dir / f"{stem}.preview.qdq.onnx"
        tab = weakref.ref(self)

        def done(report: Any) -> None:
            me = tab()
            if me is not None:
                me.show_file(report.path)
                me._shown_now()

        return self.controller.export_preview(target, done)

    def _choose_file(self) -> None:
        start = str(self.path.parent) if self.path else ""
        path, _ = QFileDialog.getOpenFileName(self, "Show an ONNX file", start, "ONNX (*.onnx);;All files (*)")
        if path:
            self.show_file(path)
            self.shown_digest = None  # any file: nothing known about where it came from
            self.update_freshness()

    def _on_session_changed(self) -> None:
        """A project opened: show its latest export if the file is still there."""
        session = self.controller.session
        latest, digest = None, None
        if session is not None:
            for record in reversed(session.project.exports):
                if Path(session.export_path(record)).is_file():
                    latest = Path(session.export_path(record))
                    digest = (record.settings or {}).get("state_digest")
                    break
        if latest is not None:
            self.show_file(latest)
        else:
            self.clear()
        self.shown_digest = digest
        self.update_freshness()
        self._busy_changed(self.controller.busy)

    def _on_export_finished(self, report: Any) -> None:
        path = getattr(report, "path", None)
        if path and Path(path).is_file():
            self.show_file(path)
            self._shown_now()

    def _shown_now(self) -> None:
        """The file shown was exported from the project as it is now."""
        session = self.controller.session
        self.shown_digest = session.state_digest() if session is not None else None
        self.update_freshness()

    @property
    def out_of_date(self) -> bool:
        """Whether the graph shown is an export of an earlier state of the project."""
        session = self.controller.session
        if session is None or self.shown_digest is None or self.path is None:
            return False
        return self.shown_digest != session.state_digest()

    def update_freshness(self, *_args: Any) -> None:
        self.stale_label.setVisible(self.out_of_date)

    def _busy_changed(self, busy: bool) -> None:
        self.preview_button.setEnabled(self.controller.session is not None and not busy)

    # ----- lifetime -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop netron, drop the web view (its page before its profile) and remove preview files."""
        self._poll.stop()
        self._load_id += 1
        self.server.stop()
        self._drop_view()
        if self._preview_dir is not None:
            shutil.rmtree(self._preview_dir, ignore_errors=True)
            self._preview_dir = None

    def _drop_view(self) -> None:
        # QtWebEngine warns, and can crash at exit, when a profile dies before its pages
        page, view, profile = self._page, self.view, self.profile
        self._page = self.view = self.profile = None
        if page is not None:
            try:
                page.loadFinished.disconnect(self._load_finished)
                page.renderProcessTerminated.disconnect(self._renderer_died)
                page.console_message.disconnect(self._console_message)
            except (RuntimeError, TypeError):
                pass
        if view is not None:
            import shiboken6
            if self.stack.indexOf(view) >= 0:
                self.stack.removeWidget(view)
            if page is not None and shiboken6.isValid(page):
                shiboken6.delete(page)
            if shiboken6.isValid(view):
                shiboken6.delete(view)
        if profile is not None:
            import shiboken6
            if shiboken6.isValid(profile):
                shiboken6.delete(profile)
        self.interceptor = None

    def closeEvent(self, event: Any) -> None:  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)


def _cleanup(server: NetronServer, folder: Path | None) -> None:
    server.stop()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)

