"""Task jobs' snapshots built from the parts they share, and the ids Dagster hashes them to.

A job's snapshot id is the sha1 of its serialized snapshot. Task jobs are aliases of a few
shared op definitions, with shared resources, executor and loggers, so most of every snapshot
(the op definitions, their config and Dagster types, the resources: about 80% of its bytes) is
the same in every job. And for a job whose config is a ``ConfigMapping`` (``step_defaults``)
Dagster builds the job's whole run-config schema only to read the mapping's type back from it.

:class:`SnapshotHasher` builds each job's snapshot from the shared parts (built, and
serialized, once per load) and the job's own (its name, tags, edges and config defaults), and
hashes it serializing only the job's own part. What it builds is ``JobSnap.from_job_def``'s
snapshot, field by field: the code server serves it to the webserver and the daemon. The
first job of each kind in a load is also built Dagster's way; a disagreement (a Dagster
upgrade that changed the snapshot) hands the rest of the load back to Dagster.
"""

from __future__ import annotations

import logging
import re
import secrets
from typing import Any, Callable

import dagster as dg
from dagster._config import ConfigSchemaSnapshot, snap_from_config_type
from dagster._core.definitions.run_config import construct_config_type_dictionary
from dagster._core.remote_representation.external_data import DEFAULT_MODE_NAME, resolve_automation_condition_args
from dagster._core.snap import JobSnap
from dagster._core.snap.dagster_types import build_dagster_type_namespace_snapshot
from dagster._core.snap.dep_snapshot import build_dep_structure_snapshot_from_graph_def
from dagster._core.snap.job_snapshot import JobLineageSnap  # noqa: F401  (JobSnap resolves its annotations here)
from dagster._core.snap.mode import ModeDefSnap, build_logger_def_snap, build_resource_def_snap
from dagster._core.snap.node import build_node_defs_snapshot
from dagster._serdes import serialize_value
from dagster_shared.serdes.serdes import _WHITELIST_MAP, _root, _transform_for_serialization
from dagster_shared.serdes.utils import hash_str
from dagster_shared.seven import json

log = logging.getLogger("agentenv_dagster")


class SnapshotHasher:
    """The snapshots, and their ids, of one load's task jobs (one job at a time: the caller,
    ``TaskJob``, holds its location's lock)."""

    def __init__(self) -> None:
        self.trusted = True  # until a job hashes differently from Dagster's own way
        self._parts: dict[tuple, Any] = {}  # what jobs share, by the identity of what it is built from
        self._json: dict[int, str | None] = {}  # id of a shared part -> its JSON, once serialized
        self._checked: set[bool] = set()  # the kinds of job (mapped config or not) checked against Dagster
        self._nonce = secrets.token_hex(8)  # a marker no snapshot's own text can contain
        self._marker = re.compile(r'"\\u0000' + self._nonce + r':(\d+)\\u0000"')  # as JSON escapes it

    def snapshot(self, job: dg.JobDefinition) -> tuple[JobSnap, str] | None:
        """``job``'s snapshot, built from the shared parts, and the id Dagster hashes it to;
        None where only Dagster's own way applies (a subset job, a job of graphs, a load whose
        check failed)."""
        if not self.trusted or job.op_selection_data or job.asset_selection_data:
            return None
        if not all(isinstance(d, dg.OpDefinition) for d in job.all_node_defs):
            return None
        try:
            snapshot = self._snapshot(job)
            snapshot_id = hash_str(self._serialize(snapshot))
        except Exception:  # a shortcut must never fail a load: Dagster's way, from here on
            log.warning("job '%s': its snapshot could not be built from the shared parts; the "
                        "load builds every job's snapshot Dagster's way", job.name, exc_info=True)
            self.trusted = False
            return None
        mapped = job.config_mapping is not None
        if mapped not in self._checked:
            self._checked.add(mapped)
            dagster_id = job.get_job_index().job_snapshot_id  # Dagster's way (cached on the job)
            if dagster_id != snapshot_id:
                log.warning("job '%s': snapshot hashed to %s, Dagster hashes it to %s; the load "
                            "builds every job's snapshot Dagster's way", job.name, snapshot_id, dagster_id)
                self.trusted = False
                return None
        return snapshot, snapshot_id

    # -- the snapshot: JobSnap.from_job_def with the shared parts built once -------------------
    def _snapshot(self, job: dg.JobDefinition) -> JobSnap:
        if job.config_mapping is not None:  # the mapping's type, without the schema it maps to
            root = job.config_mapping.config_schema.config_type
            _, config_types = construct_config_type_dictionary(job.all_node_defs, root)
        else:
            root, config_types = job.run_config_schema.config_type, job.run_config_schema.config_type_dict_by_key
        node_defs = (job.is_asset_job, *map(id, job.all_node_defs))
        automation_condition, _ = resolve_automation_condition_args(job.automation_condition)
        return JobSnap(
            name=job.name,
            description=job.description,
            tags=job.tags,
            run_tags=job.run_tags if job.has_separately_defined_run_tags else None,
            metadata=job.metadata,
            config_schema_snapshot=ConfigSchemaSnapshot(all_config_snaps_by_key={
                key: self._shared(("config", id(config_type)), snap_from_config_type, config_type)
                for key, config_type in config_types.items()
            }),
            dagster_type_namespace_snapshot=self._shared(("types", *node_defs), build_dagster_type_namespace_snapshot, job),
            node_defs_snapshot=self._shared(("nodes", *node_defs), build_node_defs_snapshot, job),
            dep_structure_snapshot=build_dep_structure_snapshot_from_graph_def(job.graph),
            mode_def_snaps=[ModeDefSnap(
                name=DEFAULT_MODE_NAME,
                description=None,
                resource_def_snaps=[
                    self._shared(("resource", name, id(rd)), build_resource_def_snap, name, rd)
                    for name, rd in sorted(job.resource_defs.items())
                ],
                logger_def_snaps=[
                    self._shared(("logger", name, id(ld)), build_logger_def_snap, name, ld)
                    for name, ld in sorted(job.loggers.items())
                ],
                root_config_key=root.key,
            )],
            lineage_snapshot=None,
            graph_def_name=job.graph.name,
            owners=job.owners,
            automation_condition=automation_condition,
        )

    def _shared(self, key: tuple, build: Callable[..., Any], *args: Any) -> Any:
        """A part built once per load; ``key`` holds the ids of what it is built from, and the
        entry holds those objects, so an id is not reused while the hasher lives. (A job's own
        config types are parts of one job: built, and serialized, as usual.)"""
        entry = self._parts.get(key)
        if entry is None:
            self._parts[key] = entry = (build(*args), args)
        elif id(entry[0]) not in self._json:  # a second job has it: serialize it once, from now on
            self._json[id(entry[0])] = None
        return entry[0]

    # -- serializing: Dagster's serialize_value, each shared part's JSON spliced in ------------
    def _serialize(self, snapshot: JobSnap) -> str:
        def pack(obj: Any, whitelist_map: Any, descent_path: str) -> Any:
            if id(obj) in self._json:
                if self._json[id(obj)] is None:
                    self._json[id(obj)] = serialize_value(obj)
                return f"\x00{self._nonce}:{id(obj)}\x00"
            serializer = whitelist_map.object_serializers[obj.__class__.__name__]
            return dict(serializer.pack_items(obj, whitelist_map, pack, descent_path))

        packed = _transform_for_serialization(snapshot, _WHITELIST_MAP, pack, _root(snapshot))
        return self._marker.sub(lambda m: self._json[int(m.group(1))], json.dumps(packed))
