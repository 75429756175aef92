"""Session services for the production profile: PostgreSQL, Redis, a moto S3 server."""

from __future__ import annotations

import pytest

from services import Unavailable, moto_s3, postgres, redis_server


def _service(factory):
    try:
        manager = factory()
        value = manager.__enter__()
    except Unavailable as exc:
        pytest.skip(str(exc))
    return manager, value


@pytest.fixture(scope="session")
def pg():
    pytest.importorskip("dagster_postgres", reason="the prod extra is not installed: pip install -e '.[prod]'")
    manager, server = _service(postgres)
    try:
        yield server
    finally:
        manager.__exit__(None, None, None)


@pytest.fixture(scope="session")
def redis_url():
    pytest.importorskip("dagster_celery", reason="the prod extra is not installed: pip install -e '.[prod]'")
    manager, url = _service(redis_server)
    try:
        yield url
    finally:
        manager.__exit__(None, None, None)


@pytest.fixture(scope="session")
def s3():
    manager, server = _service(moto_s3)
    try:
        yield server
    finally:
        manager.__exit__(None, None, None)
