"""The ``email`` env: an inbox the agent searches and reads, and an outbox it sends to.

Data arrives through ``data/add`` as ``{"emails": [...]}`` (a JSON file Part or a DataPart);
``data/get`` returns ``{"inbox": [...], "sent": [...]}`` so verifiers can check what was sent,
and ``data/add`` takes that export back too (a ``snapshot_env`` universe loads into a fresh env).
Dates are the env's time (virtual while its clock is armed): an email added without a ``date``
is stamped when it arrives, and a sent email when it is sent.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from mcp.server.mcpserver.exceptions import ToolError

from .base import EnvApp
from .clock import iso

EMAIL_FIELDS = ("id", "from", "to", "subject", "body", "date")


class EmailState:
    def __init__(self, now: Callable[[], str] | None = None) -> None:
        self.now = now or (lambda: iso(datetime.now(timezone.utc)))
        self.reset()

    def reset(self) -> None:
        self.inbox: list[dict[str, str]] = []
        self.sent: list[dict[str, str]] = []

    def add(self, documents: list[dict[str, Any]]) -> None:
        known = {email["id"] for email in self.inbox}
        loaded = []
        for doc_index, document in enumerate(documents):
            if "emails" not in document and isinstance(document.get("inbox"), list):  # an export
                self._restore_sent(document.get("sent") or [], doc_index)
                document = {"emails": document["inbox"]}
            emails = document.get("emails")
            if not isinstance(emails, list):
                raise ValueError(f"document {doc_index}: 'emails' must be a list of email objects")
            for index, raw in enumerate(emails):
                email = _email(raw, f"document {doc_index}: emails[{index}]")
                if "date" not in raw:
                    email["date"] = self.now()  # received now
                if email["id"] in known:
                    raise ValueError(f"document {doc_index}: duplicate email id '{email['id']}'")
                known.add(email["id"])
                loaded.append(email)
        self.inbox.extend(loaded)

    def get(self) -> dict[str, Any]:
        return {"inbox": self.inbox, "sent": self.sent}

    def _restore_sent(self, sent: Any, doc_index: int) -> None:
        if not isinstance(sent, list) or not all(isinstance(e, dict) and e.get("id") for e in sent):
            raise ValueError(f"document {doc_index}: 'sent' must be a list of sent emails with ids")
        self.sent.extend(dict(e) for e in sent)


def _email(raw: Any, where: str) -> dict[str, str]:
    """An inbox email with every field present; only ``id`` is required of the seed data."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be an object")
    if not isinstance(raw.get("id"), str) or not raw["id"]:
        raise ValueError(f"{where}: 'id' must be a non-empty string")
    return {field: str(raw.get(field) or "") for field in EMAIL_FIELDS}


def build() -> EnvApp:
    state = EmailState()
    env = EnvApp("email", state)
    state.now = env.now_iso

    @env.tool
    def email_search(query: str = "", sender: str = "") -> dict[str, Any]:
        """Search the inbox. `query` matches sender, subject or body and `sender` matches the
        sender, both as case-insensitive substrings; leave both empty to list every email."""
        query, sender = query.lower(), sender.lower()
        emails = [
            email for email in state.inbox
            if sender in email["from"].lower()
            and any(query in email[field].lower() for field in ("from", "subject", "body"))
        ]
        return {"emails": emails}

    @env.tool
    def read_email(email_id: str) -> dict[str, Any]:
        """Read one inbox email by its id."""
        for email in state.inbox:
            if email["id"] == email_id:
                return email
        raise ToolError(f"no email with id '{email_id}'")

    @env.tool
    def send(to: str, subject: str, body: str) -> dict[str, Any]:
        """Send an email; returns its id."""
        email_id = f"sent-{len(state.sent) + 1}"
        date = state.now()
        state.sent.append({"id": email_id, "to": to, "subject": subject, "body": body, "date": date})
        return {"id": email_id, "status": "sent"}

    return env
