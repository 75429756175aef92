"""S3ContextIOManager: the run contexts between ops as objects in a bucket.

The same documents as :class:`TaskContextIOManager` (one redacted JSON per op output,
``<prefix>/runs/<run_id>/context/<step_key>.json``), so ops on different machines — Celery
workers, Kubernetes pods — hand each other their contexts. ``endpoint_url`` points at moto
or MinIO; credentials come from boto3's usual chain (never from run config).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from ..context import redacted_json
from ..runtime.s3 import S3Location
from .io_manager import ContextIOManagerBase

_WRITTEN = "written-ns"  # object metadata: the write order (S3 timestamps are whole seconds)


class S3ContextIOManager(ContextIOManagerBase):
    """Stores ``s3://<bucket>/<prefix>/runs/<run_id>/context/<step_key>.json``."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None

    @property
    def location(self) -> S3Location:
        return S3Location(self.bucket, self.prefix, self.endpoint_url, self.region)

    def _folder(self, run_id: str) -> str:
        return self.location.key("runs", run_id, "context")

    def write(self, run_id: str, name: str, data: dict[str, Any]) -> str:
        key = f"{self._folder(run_id)}/{name}.json"
        body = redacted_json(data)  # secrets never reach the bucket
        self.location.put_bytes(key, body, ContentType="application/json", Metadata={_WRITTEN: str(time.time_ns())})
        return self.location.url(key)

    def read(self, run_id: str, name: str) -> dict[str, Any]:
        return json.loads(self.location.get_bytes(f"{self._folder(run_id)}/{name}.json"))

    def read_all(self, run_id: str, wanted: Callable[[str], bool] | None = None) -> list[tuple[str, dict[str, Any]]]:
        location, folder = self.location, self._folder(run_id) + "/"
        stored = []
        for entry in location.list_keys(folder):
            name = entry["Key"][len(folder):]
            if "/" in name or not name.endswith(".json") or (wanted and not wanted(name[: -len(".json")])):
                continue
            got = location.client.get_object(Bucket=location.bucket, Key=entry["Key"])
            order = int((got.get("Metadata") or {}).get(_WRITTEN) or 0)
            stored.append((order, name[: -len(".json")], json.loads(got["Body"].read())))
        return [(name, data) for _, name, data in sorted(stored, key=lambda s: (s[0], s[1]))]
