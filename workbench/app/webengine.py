"""QtWebEngine for the graph tab, kept on this machine: starting it (sandbox, shared OpenGL contexts),
whether it is there at all (it is imported lazily), and the page and request interceptor that let no
request leave localhost (netron's analytics, fonts, update checks), plus netron's consent cookie.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

from PySide6.QtCore import QCoreApplication, Qt, QUrl, Signal

logger = logging.getLogger(__name__)

__all__ = ["prepare_application", "webengine_status", "is_local_url", "make_interceptor", "webengine_classes",
           "consent_cookie", "LOCAL_HOSTS"]

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
HOSTLESS_SCHEMES = frozenset({"data", "blob", "about"})  # page-internal: no request leaves the machine


def prepare_application() -> None:
    """Call before the QApplication exists, so that QtWebEngine can start later if it is used.

    QtWebEngine needs OpenGL contexts shared across the application (a Qt attribute that only counts
    before the QApplication is made), and Chromium refuses to start its sandbox as root.
    """
    _sandbox_environment()
    if QCoreApplication.instance() is None:
        QCoreApplication.setAttribute(Qt.ApplicationAttribute.AA_ShareOpenGLContexts)


def _sandbox_environment() -> None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        flags = os.environ.get("QTWEBENGINE_CHROMIUM_FLAGS", "")
        if "--no-sandbox" not in flags and not os.environ.get("QTWEBENGINE_DISABLE_SANDBOX"):
            os.environ["QTWEBENGINE_DISABLE_SANDBOX"] = "1"


_WEBENGINE: tuple[bool, str] | None = None


def webengine_status() -> tuple[bool, str]:
    """(available, reason): whether QtWebEngine imports here. ``WORKBENCH_NO_WEBENGINE=1`` turns it off."""
    global _WEBENGINE
    if os.environ.get("WORKBENCH_NO_WEBENGINE", "").strip() not in ("", "0"):
        return False, "QtWebEngine is turned off (WORKBENCH_NO_WEBENGINE is set)"
    if _WEBENGINE is None:
        _sandbox_environment()  # before Chromium first starts
        try:
            import PySide6.QtWebEngineCore  # noqa: F401
            import PySide6.QtWebEngineWidgets  # noqa: F401
        except Exception as error:  # noqa: BLE001 - a missing wheel or a missing system library
            _WEBENGINE = (False, f"QtWebEngine is not available ({type(error).__name__}: {error})")
        else:
            _WEBENGINE = (True, "")
    return _WEBENGINE


def is_local_url(url: QUrl | str) -> bool:
    """Whether a request stays on this machine (localhost, or page-internal data:/blob:/about:)."""
    text = url.toString() if isinstance(url, QUrl) else str(url)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in HOSTLESS_SCHEMES:
        return True
    host = (parts.hostname or "").lower()
    return scheme in ("http", "https", "ws", "wss") and host in LOCAL_HOSTS


_CLASSES: dict[str, type] = {}


def webengine_classes() -> dict[str, type]:
    """The interceptor and page classes, defined once QtWebEngine is imported."""
    if _CLASSES:
        return _CLASSES
    from PySide6.QtWebEngineCore import QWebEnginePage, QWebEngineUrlRequestInterceptor

    class LocalOnlyInterceptor(QWebEngineUrlRequestInterceptor):
        """Blocks every request that would leave the machine (netron's analytics, fonts, update checks)."""

        def __init__(self, parent: Any = None) -> None:
            super().__init__(parent)
            self.blocked: list[str] = []

        def interceptRequest(self, info: Any) -> None:  # noqa: N802 - Qt's name
            url = info.requestUrl()
            if not is_local_url(url):
                info.block(True)
                text = url.toString()
                if len(self.blocked) < 1000:
                    self.blocked.append(text)
                logger.debug("blocked a request to %s", url.host() or text[:80])

    class LocalOnlyPage(QWebEnginePage):
        """Stays on the local netron page: links to outside sites do not navigate (they would be blocked)."""

        blocked_navigation = Signal(str)
        console_message = Signal(str)  # what the page logs (the graph tab's selection reports come this way)

        def acceptNavigationRequest(self, url: QUrl, navigation_type: Any, is_main_frame: bool) -> bool:  # noqa: N802
            if is_local_url(url):
                return True
            self.blocked_navigation.emit(url.toString())
            return False

        def javaScriptConsoleMessage(self, level: Any, message: str, line: int, source: str) -> None:  # noqa: N802
            self.console_message.emit(message)

    _CLASSES.update(interceptor=LocalOnlyInterceptor, page=LocalOnlyPage)
    return _CLASSES


def make_interceptor(parent: Any = None) -> Any:
    """A request interceptor that blocks every non-local URL (its ``blocked`` list keeps what it stopped)."""
    return webengine_classes()["interceptor"](parent)


def consent_cookie(origin: QUrl) -> Any:
    from PySide6.QtNetwork import QNetworkCookie

    # netron only checks that a "consent" cookie exists; its value is the time of consent in ms.
    cookie = QNetworkCookie(b"consent", str(int(time.time() * 1000)).encode())
    cookie.setPath("/")
    cookie.setDomain(origin.host())
    return cookie
