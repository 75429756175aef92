"""``python -m agentenv_dagster.builtin.agents <kind> --sandbox DIR --config-file F.json
--ready-file R --ttl-seconds S``: serve one embedded A2A agent on 127.0.0.1.

Each kind's module is imported only when chosen, so the replay agent starts without loading
the Anthropic SDK.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from agentenv_dagster.builtin.agents.server import run_agent
from agentenv_dagster.builtin.serving import add_serving_arguments
from agentenv_dagster.runtime.sandbox import LocalSandbox

BRAINS = {
    "replay": ("agentenv_dagster.builtin.agents.replay", "ReplayBrain"),
    "anthropic": ("agentenv_dagster.builtin.agents.anthropic_agent", "AnthropicBrain"),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv_dagster.builtin.agents")
    parser.add_argument("kind", choices=sorted(BRAINS))
    parser.add_argument("--sandbox", type=Path, required=True)
    parser.add_argument("--config-file", type=Path, required=True)
    add_serving_arguments(parser)
    args = parser.parse_args(argv)

    module, cls = BRAINS[args.kind]
    try:
        config = json.loads(args.config_file.read_text())
        brain = getattr(importlib.import_module(module), cls)(config)
    except ValueError as exc:  # a bad config file fails the deploy with one clear line
        raise SystemExit(f"agent config {args.config_file}: {exc}") from None
    args.sandbox.mkdir(parents=True, exist_ok=True)

    run_agent(
        brain,
        LocalSandbox(args.sandbox.resolve()),
        name=config.get("name", f"{args.kind}-agent"),
        description=config.get("description", f"Embedded {args.kind} agent"),
        args=args,
        workspace=config.get("workspace"),
    )


if __name__ == "__main__":
    main()
