"""Real PostgreSQL, Redis and a moto S3 server on 127.0.0.1, for the production-profile tests.

Each starts on a free port in a throwaway folder and is stopped (and its folder removed) by
its context manager; a missing binary raises ``Unavailable`` with the precise reason.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class Unavailable(RuntimeError):
    """A service cannot run on this machine (the reason says what is missing)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, what: str, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s" + (f": {last}" if last else ""))


def _binary(name: str, *globs: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for pattern in globs:
        matches = sorted(glob.glob(pattern))
        if matches:
            return matches[-1]
    return None


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    username: str
    password: str
    db_name: str

    @property
    def env(self) -> dict[str, str]:
        """What deploy/dagster.yaml reads."""
        return {
            "DAGSTER_PG_HOST": self.host, "DAGSTER_PG_PORT": str(self.port), "DAGSTER_PG_USERNAME": self.username,
            "DAGSTER_PG_PASSWORD": self.password, "DAGSTER_PG_DB": self.db_name,
        }

    def connect(self, db_name: str | None = None):
        import psycopg2

        return psycopg2.connect(host=self.host, port=self.port, user=self.username, password=self.password,
                                dbname=db_name or self.db_name, connect_timeout=5)

    def query(self, sql: str, *args) -> list[tuple]:
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cursor:
            cursor.execute(sql, args)
            return cursor.fetchall()


@contextlib.contextmanager
def postgres(db_name: str = "dagster") -> Iterator[Postgres]:
    """PostgreSQL from ``initdb`` + ``pg_ctl`` (as the ``postgres`` user when run as root:
    initdb refuses root), password auth on 127.0.0.1 only."""
    initdb = _binary("initdb", "/usr/lib/postgresql/*/bin/initdb")
    pg_ctl = _binary("pg_ctl", "/usr/lib/postgresql/*/bin/pg_ctl")
    if not initdb or not pg_ctl:
        raise Unavailable("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in "
                          "/usr/lib/postgresql/*/bin (apt-get install postgresql; .ci/run does)")
    user = None
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable("running as root and there is no 'postgres' user for initdb") from None
    folder = Path(tempfile.mkdtemp(prefix="agentenv-pg-"))
    if user:
        os.chown(folder, user.pw_uid, user.pw_gid)
    as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    password, port = "agentenv-test-pw", free_port()
    (folder / "pw").write_text(password + "\n")
    if user:
        os.chown(folder / "pw", user.pw_uid, user.pw_gid)
    data = folder / "data"
    try:
        subprocess.run(
            [initdb, "-D", str(data), "-U", "postgres", "--pwfile", str(folder / "pw"), "--auth", "scram-sha-256",
             "-E", "UTF8", "--no-sync", "--no-instructions"],
            check=True, capture_output=True, text=True, timeout=120, cwd=folder, **as_user,
        )
        subprocess.run(
            [pg_ctl, "-D", str(data), "-l", str(folder / "log"), "-w", "-t", "60", "-o",
             f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off -c full_page_writes=off", "start"],
            check=True, capture_output=True, text=True, timeout=90, cwd=folder, **as_user,
        )
        server = Postgres("127.0.0.1", port, "postgres", password, db_name)
        admin = wait_until(lambda: server.connect("postgres"), "PostgreSQL")
        admin.autocommit = True
        with contextlib.closing(admin), admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{db_name}"')
        yield server
    except subprocess.CalledProcessError as exc:
        log = (folder / "log").read_text() if (folder / "log").exists() else ""
        raise RuntimeError(f"{exc.cmd[0]} failed: {exc.stderr}{log}") from exc
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True, timeout=60,
                           cwd=folder, **as_user)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """``redis-server`` on a free loopback port, no persistence; yields its URL base."""
    binary = _binary("redis-server")
    if not binary:
        raise Unavailable("redis-server not found on PATH (apt-get install redis-server; .ci/run does)")
    import redis

    folder = Path(tempfile.mkdtemp(prefix="agentenv-redis-"))
    port = free_port()
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(folder), "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: redis.Redis(host="127.0.0.1", port=port, socket_timeout=2).ping(), "redis-server")
        yield f"redis://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str

    @property
    def env(self) -> dict[str, str]:
        """Credentials for moto (it accepts any); a real deployment uses boto3's chain."""
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [entry["Key"] for page in pages for entry in page.get("Contents") or []]


@contextlib.contextmanager
def moto_s3(bucket: str = "agentenv-test") -> Iterator[S3Server]:
    """moto's S3 server in a thread on a free loopback port, with one bucket."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        raise Unavailable(f"moto[server] is not installed ({exc}); pip install -e '.[prod]'") from None
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3Server(f"http://{host}:{port}", bucket)
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        server.stop()


class CeleryWorker:
    """A ``dagster-celery`` worker (its main process and its pool) started in its own session."""

    def __init__(self, process: subprocess.Popen, log_path: Path) -> None:
        self.process, self.log_path = process, log_path

    def processes(self) -> list:
        """The worker's main process and its pool processes, while they run."""
        import psutil

        try:
            main = psutil.Process(self.process.pid)
            return [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def pool(self) -> list:
        """The pool processes that run the worker's tasks (the children of celery's main
        process)."""
        import psutil

        def celery(process) -> bool:
            with contextlib.suppress(psutil.Error):
                return "celery" in " ".join(process.cmdline())
            return False

        mains = [p for p in self.processes()[1:] if celery(p) and p.ppid() == self.process.pid]
        return [child for main in mains for child in main.children() if celery(child)]

    def kill(self) -> None:
        """SIGKILL the worker and its pool at once, as a lost machine or the OOM killer would:
        nothing of it runs a shutdown, acknowledges or requeues a task."""
        import psutil

        everyone = self.processes()
        for process in everyone:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(everyone, timeout=30)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """Celery's warm shutdown (the pool first, then the ``dagster-celery`` parent); what
        still runs after a grace period (a task that would run on) is killed."""
        import psutil

        everyone = self.processes()
        if self.process.poll() is None:
            for child in everyone[0].children() if everyone else []:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.send_signal(signal.SIGTERM)  # celery's warm shutdown ends its pool first
            _, alive = psutil.wait_procs(everyone[1:], timeout=30)
            for process in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        psutil.wait_procs(everyone, timeout=10)
        left = [p.pid for p in everyone if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"celery worker processes left running: {left}"


@contextlib.contextmanager
def celery_worker(root: Path, env: dict[str, str], log_path: Path, *, name: str,
                  concurrency: int = 2) -> Iterator[CeleryWorker]:
    """``dagster-celery worker start`` in project ``root`` with its ``celery.yaml``, ready
    (its log says so) before it is yielded; stopped on the way out unless it was killed."""
    with open(log_path, "a") as log:
        process = subprocess.Popen(
            [shutil.which("dagster-celery") or "dagster-celery", "worker", "start", "-A", "dagster_celery.app",
             "-y", "celery.yaml", "-n", name, "--", f"--concurrency={concurrency}"],
            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    worker = CeleryWorker(process, log_path)
    try:
        wait_until(lambda: "ready." in log_path.read_text() or process.poll() is not None,
                   "the celery worker", timeout=90, interval=0.25)
        assert process.poll() is None, log_path.read_text()[-3000:]
        yield worker
    finally:
        worker.stop()
