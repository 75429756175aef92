"""``agentenv-dagster view [OUT_DIR]``: a run's reports (task.html, each row's page, task.json,
judge transcripts) served read-only on 127.0.0.1, as ``inspect view`` serves Inspect AI's logs.

The pages are static files, so this is the standard library's file server, narrowed: loopback
only, no path that resolves outside the folder (a symlink included), a Host header that names
this server (a web page cannot reach it through a rebound DNS name), and the reports'
Content-Security-Policy on every answer, so no file in the folder can run a script of its own.
"""

from __future__ import annotations

import functools
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .render import page_policy

HOST = "127.0.0.1"
_TEXT_TYPES = {".yaml": "text/plain; charset=utf-8", ".yml": "text/plain; charset=utf-8",
               ".md": "text/plain; charset=utf-8", ".log": "text/plain; charset=utf-8",
               ".json": "application/json; charset=utf-8", ".jsonl": "text/plain; charset=utf-8"}


class ReportServer(ThreadingHTTPServer):
    """The server of one folder; ``url`` once bound."""

    daemon_threads = True

    def __init__(self, folder: Path, port: int = 0) -> None:
        self.folder = folder.resolve()
        super().__init__((HOST, port), functools.partial(_ReportsHandler, directory=str(self.folder)))

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_port}/"


class _ReportsHandler(SimpleHTTPRequestHandler):
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, **_TEXT_TYPES}
    server: ReportServer

    def do_GET(self) -> None:
        if self._refused():
            return
        if self.path in ("/", "/index.html") and (self.server.folder / "task.html").is_file():
            self.send_response(HTTPStatus.FOUND)
            self.send_header("Location", "/task.html")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def do_HEAD(self) -> None:
        if not self._refused():
            super().do_HEAD()

    def send_head(self):
        """Only what lies inside the folder once every symlink is resolved."""
        target = Path(self.translate_path(self.path)).resolve()
        if not target.is_relative_to(self.server.folder):
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        return super().send_head()

    def end_headers(self) -> None:
        self.send_header("Content-Security-Policy", f"{page_policy()}; frame-ancestors 'none'")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        """Quiet: the terminal shows the address and nothing per request."""

    def _refused(self) -> bool:
        """A Host header that is not this server's address (DNS rebinding) is refused."""
        port = self.server.server_port
        if self.headers.get("Host", "") in (f"{HOST}:{port}", f"localhost:{port}"):
            return False
        self.send_error(HTTPStatus.FORBIDDEN, "Unexpected Host header")
        return True
