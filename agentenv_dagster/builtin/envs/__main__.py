"""Serve one built-in env on 127.0.0.1 until SIGTERM or its TTL (started by ``deploy_env``)."""

from __future__ import annotations

import argparse

from ..serving import add_serving_arguments, serve
from . import UnknownEnvKind, build_env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv_dagster.builtin.envs")
    parser.add_argument("kind", help="the env kind, e.g. email or item-store")
    add_serving_arguments(parser)
    args = parser.parse_args(argv)
    try:
        env = build_env(args.kind)
    except UnknownEnvKind as exc:
        parser.error(str(exc))  # exits 2
    serve(env.starlette_app(), args)


if __name__ == "__main__":
    main()
