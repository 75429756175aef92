"""S3ContextIOManager: the run's row streams as objects in a bucket, so ops on different machines
(Celery workers, Kubernetes pods) read each other's rows as they land. Credentials come from
boto3's usual chain, never from run config; ``endpoint_url`` points at moto or MinIO.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, ClassVar

from ..runtime.s3 import S3Location
from .io_manager import FAILED_ATTEMPT, ContextIOManagerBase

_ORDER = itertools.count()  # with the clock, keeps this process's appends in order


class S3ContextIOManager(ContextIOManagerBase):
    """Stores ``s3://<bucket>/<prefix>/runs/<run_id>/context/<step_key>/<n>.jsonl``."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    reads_remotely: ClassVar[bool] = True

    @property
    def location(self) -> S3Location:
        return S3Location(self.bucket, self.prefix, self.endpoint_url, self.region)

    def _folder(self, run_id: str, name: str | None = None) -> str:
        return self.location.key("runs", run_id, "context", *([name] if name else [])) + "/"

    def start_stream(self, run_id: str, name: str) -> None:
        location = self.location
        for entry in location.list_keys(self._folder(run_id, name)):
            location.client.delete_object(Bucket=location.bucket, Key=entry["Key"])

    def append_records(self, run_id: str, name: str, records: list[dict[str, Any]]) -> None:
        key = f"{self._folder(run_id, name)}{time.time_ns():020d}-{next(_ORDER):08d}.jsonl"
        self.location.put_bytes(key, self.encoded(records), ContentType="application/x-ndjson")

    def read_records(self, run_id: str, name: str, position: Any = None) -> tuple[list[dict[str, Any]], Any, bool]:
        location = self.location
        keys = [entry["Key"] for entry in location.list_keys(self._folder(run_id, name), start_after=position)]
        rows, ended = self.decoded(b"".join(location.get_bytes(key) for key in keys))  # each object ends a line
        return rows, keys[-1] if keys else position, ended

    def stream_names(self, run_id: str) -> list[str]:
        folder = self._folder(run_id)
        first: dict[str, str] = {}
        for entry in self.location.list_keys(folder):
            name, _, rest = entry["Key"][len(folder):].partition("/")
            if rest and not name.endswith(FAILED_ATTEMPT):
                first[name] = min(first.get(name, rest), rest)
        return sorted(first, key=first.__getitem__)
