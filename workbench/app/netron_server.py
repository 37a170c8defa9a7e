"""The netron server the graph tab shows: one netron on 127.0.0.1 for one file, and what the installed
netron is (version, build date, whether its page still draws). No Qt.
"""
from __future__ import annotations

import logging
import re
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["NetronServer", "netron_build_date", "netron_expired", "netron_version", "free_port",
           "NETRON_MAX_AGE_DAYS"]

NETRON_MAX_AGE_DAYS = 180  # netron's own limit (browser.js: "if (days > 180)")


def netron_build_date() -> datetime | None:
    """The build date netron's page carries (``<meta name="date">``), from which it counts its age."""
    try:
        import netron
    except ImportError:
        return None
    index = Path(netron.__file__).with_name("index.html")
    try:
        match = re.search(r'<meta name="date" content="([^"]+)"', index.read_text(encoding="utf-8"))
    except OSError:
        return None
    if not match:
        return None
    try:
        return datetime.fromisoformat(match.group(1).replace(" ", "T")).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def netron_expired(now: datetime | None = None) -> bool:
    """Whether the installed netron's page will refuse to draw ("Please update"), judged by its date."""
    built = netron_build_date()
    if built is None:
        return False
    return (now or datetime.now(timezone.utc)) - built > timedelta(days=NETRON_MAX_AGE_DAYS)


def netron_version() -> str:
    try:
        import netron
        return str(getattr(netron, "__version__", "?"))
    except ImportError:
        return "not installed"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class NetronServer:
    """One netron server on 127.0.0.1 for one file. No Qt.

    netron keeps the served content on its request handler class, shared by every server in the
    process, so a second server would change what the first one serves: one file at a time.
    """

    HOST = "127.0.0.1"

    def __init__(self) -> None:
        self.path: Path | None = None
        self.address: tuple[str, int] | None = None

    @property
    def url(self) -> str | None:
        return None if self.address is None else f"http://{self.address[0]}:{self.address[1]}/"

    @property
    def running(self) -> bool:
        if self.address is None:
            return False
        import netron
        return bool(netron.status(self.address))

    def start(self, path: str | Path) -> str:
        """Serve ``path``; returns the URL. Any earlier file stops being served.

        Raises:
            FileNotFoundError: no such file. ImportError: netron is not installed. OSError: no port.
        """
        import netron

        path = Path(path).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"No such file: {path}")
        self.stop()
        root = logging.getLogger()
        # netron.serve calls logging.basicConfig() when the root logger has no handler, which would
        # print every later log line of the app to stderr: give it one for the duration of the call.
        guard = logging.NullHandler() if not root.handlers else None
        if guard is not None:
            root.addHandler(guard)
        try:
            for attempt in range(3):  # the port found free may be taken before netron binds it
                port = free_port(self.HOST)
                try:
                    self.address = tuple(netron.start(str(path), address=(self.HOST, port), browse=False))
                    break
                except OSError:
                    if attempt == 2:
                        raise
        finally:
            if guard is not None:
                root.removeHandler(guard)
        self.path = path
        return self.url or ""

    def stop(self) -> None:
        if self.address is not None:
            import netron
            netron.stop(self.address)
        self.address = None
        self.path = None
