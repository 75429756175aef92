"""Serve one built-in env on 127.0.0.1 until SIGTERM, its run's end or its TTL (started by
``deploy_env``); ``--file-root`` names the folders its data plane may read ``file://`` Parts in."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..serving import add_serving_arguments, read_bootstrap, serve
from . import UnknownEnvKind, build_env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentenv_dagster.builtin.envs")
    parser.add_argument("kind", help="the env kind, e.g. email or item-store")
    parser.add_argument("--file-root", action="append", type=Path, default=[],
                        help="a folder data/add may read file:// Parts under (repeatable)")
    add_serving_arguments(parser)
    args = parser.parse_args(argv)
    try:
        env = build_env(args.kind)
    except UnknownEnvKind as exc:
        parser.error(str(exc))  # exits 2
    env.file_roots = tuple(args.file_root)
    serve(env.starlette_app(), args, read_bootstrap())


if __name__ == "__main__":
    main()
