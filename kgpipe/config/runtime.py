"""The sections of a run config that say where and how a run executes: the cluster,
checkpoints, fault tolerance. They may change when a run is resumed."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from kgpipe.config.base import Frozen, Registered, byte_size
from kgpipe.distributed.clusters import CLUSTERS, is_address

__all__ = ["CheckpointConfig", "DistributedConfig", "FaultToleranceConfig"]


class DistributedConfig(Frozen):
    """Training on a Dask cluster: a gang of torch.distributed ranks, one per worker."""

    workers: int = Field(
        default=1,
        ge=1,
        description="Training ranks (one per Dask worker). 1 with cluster `local` trains in-process.",
    )
    cluster: Annotated[
        str,
        Registered(
            CLUSTERS, more=", or a scheduler address such as tcp://host:8786", accept=is_address
        ),
    ] = Field(
        default="local",
        description="`local` (LocalCluster), `cuda` (LocalCUDACluster) or a scheduler address.",
    )
    sync: Literal["step", "epoch"] = Field(
        default="step",
        description="Sum gradients every step (data parallel), or average models per epoch.",
    )
    compression: Literal["none", "topk", "int8"] = Field(
        default="none", description="Compression of what is exchanged (top-k with error feedback)."
    )
    topk_ratio: float = Field(
        default=0.1, gt=0.0, le=1.0, description="Share of touched rows sent by `topk`."
    )
    exchange: Literal["auto", "dense", "sparse"] = Field(
        default="auto",
        description=(
            "Entity-gradient exchange in step mode: dense all-reduce, sparse gather of touched "
            "rows, or whichever moves fewer bytes. Relation tables always use the dense path."
        ),
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto",
        description="torch.distributed backend (auto: nccl for ranks on a GPU, else gloo).",
    )
    shards: int = Field(
        default=16, ge=1, description="Training shards written to the run folder (any world size)."
    )
    strategy: Literal["replicated", "sharded"] = Field(
        default="replicated",
        description=(
            "replicated: every rank holds the whole model. sharded: each rank holds its shards "
            "of the entity table and their optimiser state (capacity grows with the workers); "
            "rows are fetched from their owners every step. Needs sync=step."
        ),
    )
    entity_shards: int = Field(
        default=16,
        ge=1,
        description=(
            "Shards of the entity table under strategy=sharded (at least the workers; a sharded "
            "checkpoint resumes on any number of workers up to this)."
        ),
    )
    staleness: int = Field(
        default=0,
        ge=0,
        description=(
            "Under strategy=sharded: a rank may compute with a row it fetched from another rank "
            "up to this many steps before (bounded staleness: fewer rows fetched; every step's "
            "gradients still reach the owners at once). 0: every row fresh every step."
        ),
    )
    timeout_s: float = Field(
        default=300.0, gt=0.0, description="Collective/rendezvous timeout of the gang in seconds."
    )
    commit_timeout_s: float = Field(
        default=3600.0,
        gt=0.0,
        description=(
            "Timeout in seconds of a sharded commit's collectives, where the ranks wait for the "
            "slowest rank to write its shards and for rank 0 to verify every file and write the "
            "manifest (timeout_s bounds every other collective)."
        ),
    )
    share_triples: bool = Field(
        default=True,
        description=(
            "Ranks of a step-synchronised gang that share a machine map one copy of the "
            "training triples from a file in its temp folder (TMPDIR/kgpipe-triples-UID, removed "
            "when the last rank is done) instead of each holding its own. false: a copy each."
        ),
    )
    threads_per_worker: int | None = Field(
        default=None, ge=1, description="torch threads per worker (default: cores // workers)."
    )
    memory_limit: str | None = Field(
        default=None,
        description=(
            "Memory per worker of a cluster kgpipe starts (`local`, `cuda`), in Dask's notation "
            "(`3GiB`, `1.5GB`, bytes); Dask pauses a worker past 80 % of it and restarts one "
            "past 95 %. Default: Dask's (the machine's memory shared by the workers)."
        ),
    )

    launch: Literal["auto", "in_process", "dask"] = Field(
        default="auto",
        description=(
            "auto: in this process when workers == 1 and cluster is `local`, else on Dask; "
            "`dask` forces a gang even of one worker (to measure or debug the Dask path)."
        ),
    )

    @field_validator("memory_limit", mode="before")  # YAML reads 3000000000 as a number
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if byte_size(value, what="memory size", example="3GiB, 1.5GB, 500MB") <= 0:
            raise ValueError(f"a memory limit must be positive, not {value!r}")
        return str(value)

    @property
    def memory_limit_bytes(self) -> int | None:
        """``memory_limit`` in bytes (None: Dask's default)."""
        return None if self.memory_limit is None else byte_size(self.memory_limit)

    @property
    def uses_dask(self) -> bool:
        """Whether training runs as a gang on Dask (else in this process)."""
        if self.launch != "auto":
            return self.launch == "dask"
        return self.workers > 1 or self.cluster != "local"

    @model_validator(mode="after")
    def _launch(self) -> DistributedConfig:
        if self.launch == "in_process" and (self.workers > 1 or self.cluster != "local"):
            raise ValueError("distributed.launch=in_process needs workers: 1 and cluster: local")
        if self.compression == "topk" and self.sync == "epoch":
            # rows left out would keep rank-local values and the ranks would drift apart
            raise ValueError("distributed.compression=topk works with sync=step only")
        if self.staleness and self.strategy != "sharded":
            raise ValueError("distributed.staleness works with strategy=sharded only")
        if self.strategy == "sharded":
            if self.sync != "step":
                raise ValueError("distributed.strategy=sharded works with sync=step only")
            if self.compression != "none":
                raise ValueError(
                    "distributed.strategy=sharded does not compress (compression: none)"
                )
            if self.entity_shards < self.workers:
                raise ValueError(
                    f"distributed.entity_shards ({self.entity_shards}) must be at least "
                    f"distributed.workers ({self.workers}): each worker owns whole shards"
                )
        return self


class CheckpointConfig(Frozen):
    """Checkpoints under ``{run}/checkpoints/``: complete resumable state, committed by a manifest."""

    every: int = Field(default=1, ge=1, description="Commit a checkpoint every this many epochs.")
    keep_last: int = Field(default=3, ge=1, description="Committed checkpoints kept (newest).")
    keep_best: bool = Field(
        default=True, description="Also keep the checkpoint with the best validation MRR."
    )
    background: bool = Field(
        default=True,
        description=(
            "Upload in a background thread while the next epoch trains (the state is copied "
            "first: under the sharded strategy every rank copies its shards); training waits "
            "only if the previous upload is still running. Where the copy would not fit the "
            "workers' memory limit, a gang commits in the foreground instead."
        ),
    )


class FaultToleranceConfig(Frozen):
    """Recovery: relaunch failed epochs from the last committed checkpoint; retry storage."""

    max_restarts: int = Field(
        default=3, ge=0, description="Gang relaunches (from the last checkpoint) per run."
    )
    restart_backoff_s: float = Field(
        default=2.0, ge=0.0, description="Wait before the first relaunch; doubles each time."
    )
    wait_for_workers_s: float = Field(
        default=30.0,
        ge=0.0,
        description=(
            "After a failure, wait this long for the cluster to regain `distributed.workers` "
            "workers (a LocalCluster restarts dead ones), then go on with the workers alive."
        ),
    )
    worker_ttl_s: float = Field(
        default=60.0,
        gt=0.0,
        description="Heartbeat timeout: a LocalCluster worker silent this long is declared dead.",
    )
    lease_ttl_s: float = Field(
        default=60.0,
        ge=5.0,
        description=(
            "One writer per run folder: the writer renews its lease every quarter of this; "
            "a lease not renewed this long (its writer died) may be taken over."
        ),
    )
    storage_retries: int = Field(
        default=6, ge=0, description="Retries of a failed object-store operation."
    )
    storage_backoff_s: float = Field(
        default=0.5,
        ge=0.0,
        description="First retry delay of storage operations; doubles, max 10 s.",
    )
