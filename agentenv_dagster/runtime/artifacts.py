"""A versioned filesystem artifact store (agent-env's local object + document stores).

Every ``put`` adds a version and never overwrites one. Read-only *bundle* folders (``artifacts/<id>/`` with an
optional ``artifact.json``) serve as version 1 of artifacts the store has never seen, like agent-env's bundles.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from filelock import FileLock

from ..ids import check_id, path_under
from ..redaction import redact_bytes

MANIFEST = "artifact.json"
FILE_TYPES = ("file", "file_artifact_universe")
ENVIRONMENT_TYPES = ("environment", "service", "environment_universe", "service_universe")


class ArtifactNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Artifact:
    id: str
    version: int
    type: str
    folder: Path
    environment_name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_manifest(cls, artifact_id: str, version: int, folder: Path, manifest: dict[str, Any], **extra: Any):
        """The version a manifest describes: its ``type``, ``environment_name`` and the rest as metadata."""
        return cls(id=artifact_id, version=version, type=manifest.pop("type"), folder=folder,
                   environment_name=manifest.pop("environment_name", None), metadata=manifest, **extra)

    @property
    def _root(self) -> Path:
        return self.folder / "files"

    @property
    def files(self) -> dict[str, Path]:
        """relative path -> host path of every file the artifact holds."""
        return {p.relative_to(self._root).as_posix(): p for p in sorted(self._root.rglob("*")) if p.is_file()}

    def object_url(self, relpath: str) -> str:
        return (self._root / relpath).resolve().as_uri()

    def ref(self) -> dict[str, Any]:
        return {"id": self.id, "version": self.version}


def write_version(folder: Path, files: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """A version's files under ``folder/files`` (each path kept inside it) and its manifest."""
    for relpath, data in files.items():
        target = path_under(folder / "files", *Path(relpath).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (folder / "files").mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


class VersionedStore:
    """What the filesystem and S3 artifact stores share (each gives ``versions`` and ``_read``): ``get`` reads
    a stored version, else a read-only bundle folder as version 1 of an artifact the store has never seen."""

    def __init__(self, root: Path, bundle_dirs: list[Path] | None = None):
        self.root = root
        self.bundle_dirs = list(bundle_dirs or [])

    def get(self, artifact_id: str, version: int | None = None) -> Artifact:
        """``version``, or the latest when None; one the artifact lacks is an error."""
        versions = self.versions(artifact_id)
        if versions:
            chosen = max(versions) if version is None else version
            if chosen not in versions:
                raise ArtifactNotFound(f"Artifact '{artifact_id}' has no version {version} (versions: {versions})")
            return self._read(artifact_id, chosen)
        for base in self.bundle_dirs:
            folder = path_under(base, check_id(artifact_id, "artifact id"))
            if folder.is_dir() and version in (None, 1):
                stored = json.loads((folder / MANIFEST).read_text()) if (folder / MANIFEST).exists() else {}
                manifest = {"type": "file_artifact_universe", **stored}
                return _BundleArtifact.from_manifest(artifact_id, 1, folder, manifest)
        raise ArtifactNotFound(f"Artifact '{artifact_id}' not found")


class FilesystemArtifactStore(VersionedStore):
    def _folder(self, artifact_id: str) -> Path:
        """The artifact's folder; an id that could name anything else is refused."""
        return path_under(self.root, check_id(artifact_id, "artifact id"))

    def versions(self, artifact_id: str) -> list[int]:
        folder = self._folder(artifact_id)
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []

    def put(self, artifact_id: str, artifact_type: str, files: dict[str, bytes], **meta: Any) -> Artifact:
        """Store a new version (concurrent writers of one id get distinct ones); each file's path stays inside it."""
        folder = self._folder(artifact_id)
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / ".lock")):
            version = max(self.versions(artifact_id), default=0) + 1
            staging = Path(tempfile.mkdtemp(dir=folder, prefix=".staging-"))
            write_version(staging, files, {"type": artifact_type, **meta})
            os.replace(staging, folder / str(version))
        return self.get(artifact_id, version)

    def _read(self, artifact_id: str, version: int) -> Artifact:
        folder = self._folder(artifact_id) / str(version)
        return Artifact.from_manifest(artifact_id, version, folder, json.loads((folder / MANIFEST).read_text()))


class _BundleArtifact(Artifact):
    """A bundle folder: files sit beside the optional manifest, not under ``files/``."""

    @property
    def _root(self) -> Path:
        return self.folder

    @property
    def files(self) -> dict[str, Path]:
        return {relpath: p for relpath, p in super().files.items() if p.name != MANIFEST}


class ObjectStore:
    """Plain objects by key (trajectories, judge transcripts), addressed by file URL."""

    def __init__(self, root: Path):
        self.root = root

    @functools.cached_property
    def _real_root(self) -> Path:
        return self.root.resolve()

    def put(self, key: str, data: bytes) -> str:
        """Store ``data`` redacted (a trajectory may echo a secret). Keys are ours, never links, so
        normalizing one keeps it inside, without resolving paths again for every object."""
        target = Path(os.path.normpath(self._real_root / key))
        if self._real_root not in target.parents:
            raise ValueError(f"object key {key!r} leaves the object store")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(redact_bytes(data))
        return target.as_uri()

    @staticmethod
    def read(url: str) -> bytes:
        """An object by URL, whichever store wrote it (``file://`` here, ``s3://`` a bucket)."""
        if url.startswith("s3://"):
            from .s3 import read_url

            return read_url(url)
        if not url.startswith("file://"):
            raise ValueError(f"only file:// and s3:// object URLs are readable, not {url!r}")
        return Path(unquote(urlparse(url).path)).read_bytes()
