"""The offline replay agent: a scripted trajectory of real MCP tool calls, like Inspect AI's
``mockllm``.

Deterministic and key-free, so a task runs end to end with no network: the env under test
sees real tool calls, the sandbox gets real files, and verifiers grade the real end state.
The first episode whose ``match`` regex is found in the prompt is played; no match fails the
task with ``NoScriptedReply`` rather than inventing an answer. A ``reply`` may be a JSON
object, sent as its JSON text: that is how a replay agent plays a multi-turn ``prompt_agent``'s
user, matching the agent's reply and answering ``{"message": ..., "done": ...}``.

Config file::

    {"name": "replay-agent", "delay_seconds": 0,
     "episodes": [{"match": "refund", "reply": "Done.",
                   "actions": [{"tool": "mcp__email__send_email", "arguments": {...}},
                               {"write_file": "/app/artifact/x.txt", "content": "..."},
                               {"sleep": 0.1}]},
                  {"match": "Anything else", "reply": {"message": "No, thanks.", "done": true}}]}
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

from agentenv_dagster.builtin.agents.server import AgentFailure, Reply, TaskSession

ACTION_KINDS = ("tool", "write_file", "sleep")


@dataclass(frozen=True)
class Episode:
    pattern: re.Pattern[str]
    actions: list[dict]
    reply: str


class ReplayBrain:
    """Plays the first matching episode; the config is checked at start-up so a broken
    script fails the deploy, not the prompt."""

    def __init__(self, config: dict) -> None:
        self.delay_seconds = float(config.get("delay_seconds", 0))
        self.episodes = [_episode(i, e) for i, e in enumerate(config.get("episodes", []))]

    async def run(self, prompt: str, session: TaskSession) -> Reply:
        session.model = "replay"
        episode = next((e for e in self.episodes if e.pattern.search(prompt)), None)
        if episode is None:
            raise AgentFailure(
                "NoScriptedReply", f"no replay episode matches the prompt {prompt[:200]!r}"
            )
        for action in episode.actions:
            if "tool" in action:  # each scripted call stands for one model turn
                session.turn_started()
                await session.call_tool(action["tool"], action.get("arguments", {}))
            elif "write_file" in action:
                path = session.sandbox.resolve(action["write_file"])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(action.get("content", ""))
                session.record({"type": "file_write", "path": action["write_file"],
                                "bytes": path.stat().st_size})
            else:
                await asyncio.sleep(float(action["sleep"]))
        await asyncio.sleep(self.delay_seconds)
        return Reply(episode.reply)


def _episode(index: int, raw: dict) -> Episode:
    where = f"replay episode {index}"
    try:
        pattern = re.compile(raw["match"])
    except (KeyError, TypeError, re.error) as exc:
        raise ValueError(f"{where}: 'match' must be a regular expression ({exc})") from None
    reply = raw.get("reply")
    if isinstance(reply, dict):
        reply = json.dumps(reply)
    if not isinstance(reply, str):
        raise ValueError(f"{where}: 'reply' must be a string or a JSON object")
    actions = raw.get("actions", [])
    for action in actions:
        if not isinstance(action, dict) or sum(kind in action for kind in ACTION_KINDS) != 1:
            raise ValueError(f"{where}: each action needs exactly one of {ACTION_KINDS}: {action}")
    return Episode(pattern, actions, reply)
