"""Checks the Monday task's end state: Dana's email set off the trigger, and the assistant
answered her after 9:00 that Monday morning on the env's virtual clock (not the wall clock).

Triggers fire in the background, so the check first waits (up to a minute) for the trigger to
settle, reading the env's trigger state.
"""

import asyncio
from datetime import datetime, timedelta, timezone

import httpx

TRIGGER_ID = "dana-email"
MONDAY_NINE = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
NOON = MONDAY_NINE + timedelta(hours=3)
SETTLE_SECONDS = 60


def _when(stamp: str) -> datetime | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None


async def _settled_trigger(http: httpx.AsyncClient, base: str) -> dict:
    deadline = asyncio.get_running_loop().time() + SETTLE_SECONDS
    while True:
        state = (await http.get(f"{base}/triggers/state")).json()
        trigger = next((t for t in state["triggers"] if t["id"] == TRIGGER_ID), {})
        if trigger.get("status") == "fired" or trigger.get("failure_count") \
                or asyncio.get_running_loop().time() > deadline:
            return trigger
        await asyncio.sleep(0.2)


async def verify(mcp_url: str) -> list[dict]:
    base = mcp_url.rstrip("/").removesuffix("/mcp")
    async with httpx.AsyncClient(timeout=30) as http:
        trigger = await _settled_trigger(http, base)
        reply = await http.post(
            f"{base}/agentenv", json={"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}}
        )
    state = next(p["data"] for p in reply.json()["result"]["parts"] if p.get("kind") == "data")
    arrived = [_when(m["date"]) for m in state.get("inbox", []) if "dana" in m.get("from", "").lower()]
    answers = [_when(m.get("date")) for m in state.get("sent", []) if "dana" in m.get("to", "").lower()]
    earliest = max([MONDAY_NINE, *filter(None, arrived)])
    checks = [
        ("trigger_fired", f"The trigger '{TRIGGER_ID}' fired once Dana's email arrived.",
         trigger.get("status") == "fired" and trigger.get("fire_count", 0) >= 1),
        ("replied_to_dana", "An email was sent to Dana.", bool(answers)),
        ("answered_monday_morning",
         "Dana was answered after 9:00 on Monday (and after her email arrived), before noon, in virtual time.",
         any(a is not None and earliest <= a < NOON for a in answers)),
    ]
    return [
        {"id": cid, "criterion": criterion, "result": ok, "score": 1.0 if ok else 0.0, "weight": 1}
        for cid, criterion, ok in checks
    ]
