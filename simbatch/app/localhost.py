"""The local web servers' common ground (``simbatch view``, ``simbatch explore``): localhost, and only it.

A server here binds 127.0.0.1, so no other machine reaches it. A page on another site can still,
by DNS rebinding (its name re-pointed at 127.0.0.1), make the browser send requests here; those
carry that site's name in their ``Host`` header, so a request is answered only when its Host is
this server's own: ``127.0.0.1``, ``localhost`` or ``[::1]``, with the server's port (403 otherwise; a port
forwarded over ssh must keep its number, ``ssh -L PORT:127.0.0.1:PORT``).

A browser that closes a tab mid-transfer leaves a broken pipe or a reset connection: that is the
client's leaving, not an error of the server, and is not reported.

:func:`folder_server` is ``simbatch view``'s: a result folder's own files, and nothing else.
"""

from __future__ import annotations

import http.server
import mimetypes
import os
import shutil
import socketserver
import sys
import urllib.parse
from pathlib import Path

LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
"""What a write to a client that has left raises."""


class LocalServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server on 127.0.0.1 (``port`` 0: a free one) for ``handler``, quiet about clients
    that left."""

    def __init__(self, handler: type[socketserver.BaseRequestHandler], port: int = 0):
        super().__init__(("127.0.0.1", port), handler)

    def allowed_hosts(self) -> frozenset[str]:
        """The Host headers this server answers (lowercase)."""
        return frozenset(f"{name}:{self.server_port}" for name in LOCAL_NAMES)

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], GONE):
            return
        super().handle_error(request, client_address)


class LocalHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that answers only requests addressed to this server by name (see the module),
    and writes no line per request."""

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in self.server.allowed_hosts():
            port = self.server.server_port
            self.send_error(403, "Forbidden", f"this server answers requests for 127.0.0.1:{port}, localhost:{port} "
                                              f"or [::1]:{port} only; over ssh, forward the same port: "
                                              f"ssh -L {port}:127.0.0.1:{port}")
            return False
        return True

    def log_message(self, format, *args) -> None:  # noqa: A002 - the signature http.server calls
        """No line per request: the terminal shows the URL and nothing else."""


def folder_file(root: Path, url_path: str) -> Path | None:
    """The regular file under ``root`` (resolved) that ``url_path`` names, or None: nothing outside
    ``root``, whatever links or ``..`` the path holds, and no folder."""
    relative = urllib.parse.unquote(urllib.parse.urlsplit(url_path).path).lstrip("/")
    try:
        real = (root / relative).resolve(strict=True)
        return real if real.is_relative_to(root) and real.is_file() else None
    except (OSError, ValueError, RuntimeError):  # missing, a NUL byte, a loop of links
        return None


class _FolderHandler(LocalHandler):
    """GET and HEAD of the served folder's own files (``server.root``, resolved); ``/`` is the report."""

    def _answer(self, body: bool) -> None:
        if urllib.parse.urlsplit(self.path).path == "/":
            self.send_response(302)
            self.send_header("Location", "/report.html")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = folder_file(self.server.root, self.path)
        if path is None:
            self.send_error(404, "Not Found")
            return
        with open(path, "rb") as f:
            self.send_response(200)
            self.send_header("Content-Type", mimetypes.guess_type(path.name)[0] or "application/octet-stream")
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.end_headers()
            if body:
                shutil.copyfileobj(f, self.wfile)

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)


def folder_server(folder: Path, port: int = 0) -> LocalServer:
    """A server of ``folder``'s own files (no listings, nothing outside it) on 127.0.0.1."""
    server = LocalServer(_FolderHandler, port)
    server.root = folder.resolve()
    return server
