"""``python -m agentenv_dagster.builtin.agents <kind> --sandbox DIR --config-file F.json
--ready-file R --ttl-seconds S``: serve one embedded A2A agent on 127.0.0.1.

``python -m agentenv_dagster.builtin.agents host --ready-file R --ttl-seconds S`` serves an
agent host instead: one process in which a run deploys all its agents (see ``host.py``).
Either reads its bootstrap on standard input (``serving.read_bootstrap``): the run's token,
and the model APIs it may call with their keys (``model_access.py``), which it also proxies
for coding CLIs under ``/model-proxy/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    # No tracer is set up in an embedded agent: a2a-sdk's own switch turns its spans off
    # (read as a2a is imported) unless the environment asks for them.
    os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

from agentenv_dagster.builtin.agents.brains import BRAINS, build_brain
from agentenv_dagster.builtin.agents.model_access import MODELS
from agentenv_dagster.builtin.serving import add_serving_arguments, read_bootstrap, serve
from agentenv_dagster.runtime.sandbox import LocalSandbox

HOST = "host"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m agentenv_dagster.builtin.agents")
    parser.add_argument("kind", choices=sorted([*BRAINS, HOST]))
    parser.add_argument("--sandbox", type=Path)
    parser.add_argument("--config-file", type=Path)
    add_serving_arguments(parser)
    args = parser.parse_args(argv)
    bootstrap = read_bootstrap()
    MODELS.install(bootstrap)
    if args.kind == HOST:
        app, on_ready = _agent_host()
        serve(app, args, bootstrap, on_ready=on_ready, open_paths=MODELS.is_proxy_path)
        return
    if args.sandbox is None or args.config_file is None:
        parser.error("an agent needs --sandbox and --config-file")

    from agentenv_dagster.builtin.agents.server import run_agent

    try:
        config = json.loads(args.config_file.read_text())
        brain = build_brain(args.kind, config)
    except ValueError as exc:  # a bad config file fails the deploy with one clear line
        raise SystemExit(f"agent config {args.config_file}: {exc}") from None
    args.sandbox.mkdir(parents=True, exist_ok=True)

    run_agent(
        brain,
        LocalSandbox(args.sandbox.resolve()),
        name=config.get("name", f"{args.kind}-agent"),
        description=config.get("description", f"Embedded {args.kind} agent"),
        args=args,
        bootstrap=bootstrap,
        workspace=config.get("workspace"),
    )


def _agent_host():
    """The host's app (its agents, and the model proxy) and what it learns once listening."""
    from agentenv_dagster.builtin.agents.host import AgentHost

    host = AgentHost()

    def on_ready(url: str) -> None:
        MODELS.host_url = url
        host.set_url(url)

    return MODELS.in_front_of(host.app()), on_ready


if __name__ == "__main__":
    main()
