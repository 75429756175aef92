"""A versioned filesystem artifact store (agent-env's local object + document stores).

Every ``put`` adds a version and never overwrites one. Read-only *bundle* folders
(``artifacts/<id>/`` with an optional ``artifact.json``) serve as version 1 of artifacts
the store has never seen, like agent-env's bundle artifacts.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    @property
    def files(self) -> dict[str, Path]:
        """relative path -> host path of every file the artifact holds."""
        root = self.folder / "files"
        return {
            p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()
        }

    def object_url(self, relpath: str) -> str:
        return (self.folder / "files" / relpath).resolve().as_uri()

    def ref(self) -> dict[str, Any]:
        return {"id": self.id, "version": self.version}


def chosen_version(artifact_id: str, version: int | None, versions: list[int]) -> int:
    """``version``, or the latest when None; one the artifact lacks is an error."""
    chosen = max(versions) if version is None else version
    if chosen not in versions:
        raise ArtifactNotFound(f"Artifact '{artifact_id}' has no version {version} (versions: {versions})")
    return chosen


class FilesystemArtifactStore:
    def __init__(self, root: Path, bundle_dirs: list[Path] | None = None):
        self.root = root
        self.bundle_dirs = [d for d in (bundle_dirs or [])]

    def get(self, artifact_id: str, version: int | None = None) -> Artifact:
        versions = self.versions(artifact_id)
        if versions:
            chosen = chosen_version(artifact_id, version, versions)
            return self._read(artifact_id, chosen, self._folder(artifact_id) / str(chosen))
        bundle = self._bundle(artifact_id)
        if bundle is not None and version in (None, 1):
            return bundle
        raise ArtifactNotFound(f"Artifact '{artifact_id}' not found")

    def _folder(self, artifact_id: str) -> Path:
        """The artifact's folder; an id that could name anything else is refused."""
        return path_under(self.root, check_id(artifact_id, "artifact id"))

    def versions(self, artifact_id: str) -> list[int]:
        folder = self._folder(artifact_id)
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())

    def put(self, artifact_id: str, artifact_type: str, files: dict[str, bytes], **meta: Any) -> Artifact:
        """Store a new version; concurrent writers of one id get distinct versions. Each
        file's relative path stays inside the version."""
        folder = self._folder(artifact_id)
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / ".lock")):
            version = max(self.versions(artifact_id), default=0) + 1
            staging = Path(tempfile.mkdtemp(dir=folder, prefix=".staging-"))
            for relpath, data in files.items():
                target = path_under(staging / "files", *Path(relpath).parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            (staging / "files").mkdir(exist_ok=True)
            (staging / MANIFEST).write_text(json.dumps({"type": artifact_type, **meta}, indent=2))
            os.replace(staging, folder / str(version))
        return self.get(artifact_id, version)

    def _bundle(self, artifact_id: str) -> Artifact | None:
        for base in self.bundle_dirs:
            folder = path_under(base, check_id(artifact_id, "artifact id"))
            if folder.is_dir():
                return _BundleArtifact.read(artifact_id, folder)
        return None

    def _read(self, artifact_id: str, version: int, folder: Path) -> Artifact:
        manifest = json.loads((folder / MANIFEST).read_text())
        return Artifact(
            id=artifact_id,
            version=version,
            type=manifest.pop("type"),
            folder=folder,
            environment_name=manifest.pop("environment_name", None),
            metadata=manifest,
        )


class _BundleArtifact(Artifact):
    """A bundle folder: files sit beside the optional manifest, not under ``files/``."""

    @classmethod
    def read(cls, artifact_id: str, folder: Path) -> "_BundleArtifact":
        manifest_path = folder / MANIFEST
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        return cls(
            id=artifact_id,
            version=1,
            type=manifest.pop("type", "file_artifact_universe"),
            folder=folder,
            environment_name=manifest.pop("environment_name", None),
            metadata=manifest,
        )

    @property
    def files(self) -> dict[str, Path]:
        return {
            p.relative_to(self.folder).as_posix(): p
            for p in sorted(self.folder.rglob("*"))
            if p.is_file() and p.name != MANIFEST
        }

    def object_url(self, relpath: str) -> str:
        return (self.folder / relpath).resolve().as_uri()


class ObjectStore:
    """Plain objects by key (trajectories, judge transcripts), addressed by file URL."""

    def __init__(self, root: Path):
        self.root = root

    @functools.cached_property
    def _real_root(self) -> Path:
        return self.root.resolve()

    def put(self, key: str, data: bytes) -> str:
        """Keys are ours, never links: normalizing one is enough to keep it inside (resolving
        both paths again, a syscall a folder, was half the cost of a row's trajectory). What
        is stored is redacted (``redaction.py``): a trajectory may echo a secret."""
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
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(url).path)).read_bytes()
