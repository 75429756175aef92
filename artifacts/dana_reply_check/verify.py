"""Checks the email env's end state: a signed reply to Dana about the Q3 numbers."""

import re

import httpx

SIGN_OFF = re.compile(r"(?im)^\s*(best|regards|best regards|kind regards|thanks|thank you|cheers|sincerely)\b")


async def verify(mcp_url: str) -> list[dict]:
    base = mcp_url.rstrip("/").removesuffix("/mcp")
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(
            f"{base}/agentenv", json={"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}}
        )
    parts = reply.json()["result"]["parts"]
    state = next(p["data"] for p in parts if p.get("kind") == "data")
    to_dana = [m for m in state.get("sent", []) if "dana" in m.get("to", "").lower()]
    text = " ".join(f"{m.get('subject', '')} {m.get('body', '')}" for m in to_dana).lower()
    checks = [
        ("sent_to_dana", "An email was sent to Dana.", bool(to_dana)),
        ("about_q3", "The email to Dana is about the Q3 numbers.", "q3" in text),
        ("signed", "The email to Dana ends with a sign-off.",
         any(SIGN_OFF.search(m.get("body", "")) for m in to_dana)),
    ]
    return [
        {"id": cid, "criterion": criterion, "result": ok, "score": 1.0 if ok else 0.0, "weight": 1}
        for cid, criterion, ok in checks
    ]
