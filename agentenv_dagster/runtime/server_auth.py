"""The run's bearer token on requests to the run's own servers, and on no others.

Every server a run starts answers 401 without the run's token (``builtin/serving.py``). This ``httpx.Auth`` adds it only
for origins the run's ledger lists (loopback servers the run started): never an outside agent, env or model API.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Generator
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    from .local import Ledger

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def origin(url: str | httpx.URL) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a URL, or None when it has no host."""
    parts = urlsplit(str(url))
    if not parts.hostname:
        return None
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    except ValueError:
        return None
    return parts.scheme, parts.hostname, port


class RunServerAuth(httpx.Auth):
    """Adds the run's token to requests for the servers the run's ledger lists; the ledger is
    read again when it changed and an unlisted loopback origin is asked about."""

    def __init__(self, ledger: "Ledger") -> None:
        self.ledger = ledger
        self._origins: set[tuple[str, str, int]] = set()
        self._seen: int | None = None  # the ledger folder's mtime when last read
        self._token: str | None = None  # the run's, once it exists (it never changes)

    def headers_for(self, url: str | httpx.URL | None) -> dict[str, str]:
        """``{"Authorization": "Bearer <token>"}`` when ``url`` is one of the run's servers, else ``{}``."""
        where = origin(url) if url else None
        if where is None or where[1] not in LOOPBACK or not self._is_own(where):
            return {}
        self._token = self._token or self.ledger.token(create=False)
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def url_with_token(self, url: str) -> str:
        """``url`` carrying the run's token as its password (HTTP Basic auth) when it is one of the run's servers: for
        code that takes only a URL, like an env-outcome verifier's ``verify(mcp_url)``."""
        if not self.headers_for(url):
            return url
        parts = urlsplit(url)
        return parts._replace(netloc=f"agentenv:{self._token}@{parts.netloc}").geturl()

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(self.headers_for(request.url))
        yield request

    def _is_own(self, where: tuple[str, str, int]) -> bool:
        if where in self._origins:
            return True
        try:
            mtime = os.stat(self.ledger.folder).st_mtime_ns
        except OSError:
            return False
        if mtime != self._seen:
            self._seen = mtime
            self._origins |= {o for entry in self.ledger.entries().values()
                              if entry.get("url") and (o := origin(entry["url"])) is not None}
        return where in self._origins
