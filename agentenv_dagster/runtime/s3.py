"""The S3 face of the stores (``[stores] backend = "s3"``): artifacts, objects and run contexts
in a bucket, behind the filesystem stores' methods, so step code does not know which it has. A
version is claimed with a conditional write (``If-None-Match: *``): writers anywhere never share one.

Layout under ``s3://<bucket>/<prefix>/``::

    artifacts/<id>/<version>/files/<relpath>    the files of a version
    artifacts/<id>/_versions/<version>          empty = claimed; the manifest once complete
    objects/<key>                               trajectories, judge transcripts
    runs/<run_id>/context/<step_key>.json       the contexts between ops (the IO manager)
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import urlparse

from filelock import FileLock

from ..ids import check_id
from ..redaction import redact_bytes
from .artifacts import MANIFEST, Artifact, ObjectStore, VersionedStore, write_version

if TYPE_CHECKING:
    from ..config import AgentEnvConfig

_COMPLETE = ".complete"  # marks a version's files as fully downloaded to the local cache


@dataclass(frozen=True)
class S3Location:
    """A bucket and a key prefix, and how to reach them."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p and p.strip("/"))

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    @property
    def client(self):
        _KNOWN.setdefault(self.bucket, self)
        return _client(self.endpoint_url, self.region)

    def list_keys(self, prefix: str, start_after: str | None = None) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix`` (``Key``, ``Size``, ``LastModified``) in key order, after ``start_after``."""
        after = {"StartAfter": start_after} if start_after else {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, **after):
            yield from page.get("Contents") or []

    def get_bytes(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def put_bytes(self, key: str, data: bytes, **extra: Any) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **extra)


def s3_location(config: "AgentEnvConfig") -> S3Location:
    """The project's bucket, ``env:`` references resolved."""
    from ..config import ConfigError, resolve_reference

    stores = config.stores
    bucket = resolve_reference(stores.bucket)
    if not bucket:
        raise ConfigError(f"[stores] bucket = {stores.bucket!r} names no bucket")
    return S3Location(bucket=bucket, prefix=resolve_reference(stores.prefix) or "",
                      endpoint_url=resolve_reference(stores.endpoint_url), region=resolve_reference(stores.region))


@functools.lru_cache(maxsize=None)
def _client(endpoint_url: str | None, region: str | None):
    """One boto3 client per endpoint: clients are thread-safe, and building one costs far more than a request."""
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region)


os.register_at_fork(after_in_child=_client.cache_clear)  # a forked process opens its own connections


# The endpoint of each bucket a store in this process was built for, so a bare ``s3://`` URL (ObjectStore.read is
# static) reaches the same server. A cache, not state: without it the config decides, then boto3. setdefault is atomic.
_KNOWN: dict[str, S3Location] = {}


def read_url(url: str) -> bytes:
    """The bytes of ``s3://bucket/key``."""
    from ..config import load_config

    parsed = urlparse(url)
    location = _KNOWN.get(parsed.netloc)
    if location is None:
        with contextlib.suppress(Exception):  # no usable project config here: boto3's defaults decide
            config = load_config()
            if config.stores.backend == "s3" and (configured := s3_location(config)).bucket == parsed.netloc:
                location = configured
    return (location or S3Location(parsed.netloc)).get_bytes(parsed.path.lstrip("/"))


def _safe_key(key: str) -> str:
    parts = PurePosixPath(key).parts
    if not parts or key.startswith("/") or ".." in parts:
        raise ValueError(f"object key {key!r} leaves the object store")
    return key


@dataclass(frozen=True)
class S3Artifact(Artifact):
    """A stored version; its files are fetched into the local cache when first read (versions never change)."""

    location: S3Location | None = field(default=None, compare=False)
    base_key: str = ""

    @property
    def files(self) -> dict[str, Path]:
        if not (self.folder / _COMPLETE).exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.folder) + ".lock"):
                if not (self.folder / _COMPLETE).exists():
                    self._download()
        return super().files

    def object_url(self, relpath: str) -> str:
        return self.location.url(f"{self.base_key}/files/{relpath}")

    def _download(self) -> None:
        files_prefix = f"{self.base_key}/files/"
        for entry in self.location.list_keys(files_prefix):
            target = self.folder / "files" / entry["Key"][len(files_prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.location.get_bytes(entry["Key"]))
        (self.folder / "files").mkdir(exist_ok=True)
        (self.folder / _COMPLETE).touch()


class S3ArtifactStore(VersionedStore):
    """The versioned artifact store in a bucket; ``root`` is the local download cache."""

    def __init__(self, location: S3Location, cache_dir: Path, bundle_dirs: list[Path] | None = None):
        super().__init__(cache_dir, bundle_dirs)
        self.location = location

    def _base(self, artifact_id: str, version: int | None = None) -> str:
        check_id(artifact_id, "artifact id")
        return self.location.key("artifacts", artifact_id, *([str(version)] if version is not None else []))

    def _claims(self, artifact_id: str) -> dict[int, int]:
        """version -> size of its claim object (0 = claimed, still being written)."""
        prefix = self._claim(artifact_id, "")
        sizes = {entry["Key"][len(prefix):]: entry["Size"] for entry in self.location.list_keys(prefix)}
        return {int(name): size for name, size in sizes.items() if name.isdigit()}

    def _claim(self, artifact_id: str, version: int | str) -> str:
        return f"{self._base(artifact_id)}/_versions/{version}"

    def versions(self, artifact_id: str) -> list[int]:
        return sorted(v for v, size in self._claims(artifact_id).items() if size > 0)

    def put(self, artifact_id: str, artifact_type: str, files: dict[str, bytes], **meta: Any) -> Artifact:
        """Store a new version: claim the next number (a conditional create, so concurrent
        writers anywhere get distinct versions), upload the files, then the manifest."""
        from botocore.exceptions import ClientError

        for version in itertools.count(max(self._claims(artifact_id), default=0) + 1):
            claim = self._claim(artifact_id, version)
            try:
                self.location.put_bytes(claim, b"", IfNoneMatch="*")
                break
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
                    raise
        base = self._base(artifact_id, version)
        for relpath, data in files.items():
            self.location.put_bytes(f"{base}/files/{_safe_key(relpath)}", data)
        manifest = {"type": artifact_type, **meta}
        self.location.put_bytes(claim, json.dumps(manifest, indent=2).encode(), ContentType="application/json")
        folder = self.root / self.location.bucket / base  # the local cache: what was written is what a read fetches
        write_version(folder, files, manifest)
        (folder / _COMPLETE).touch()
        return self.get(artifact_id, version)

    def _read(self, artifact_id: str, version: int) -> Artifact:
        folder = self.root / self.location.bucket / (base := self._base(artifact_id, version))
        cached = folder / MANIFEST  # else the claim object, which holds the manifest once complete
        stored = cached.read_text() if cached.is_file() else self.location.get_bytes(self._claim(artifact_id, version))
        return S3Artifact.from_manifest(artifact_id, version, folder, json.loads(stored), location=self.location,
                                        base_key=base)


class S3ObjectStore:
    """Plain objects by key (trajectories, judge transcripts), addressed by ``s3://`` URL."""

    def __init__(self, location: S3Location):
        self.location = location

    def put(self, key: str, data: bytes) -> str:
        """Stored redacted, as the filesystem's ``ObjectStore`` does."""
        full = self.location.key("objects", _safe_key(key))
        self.location.put_bytes(full, redact_bytes(data))
        return self.location.url(full)

    read = staticmethod(ObjectStore.read)
