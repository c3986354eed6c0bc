"""What one rank of a gang holds, estimated before launch, and the check against the workers'
memory limit (``distributed.memory_limit``, or the limit a running scheduler's workers have).

The estimate is the part of a rank's memory that grows with the graph and the model; the rest
(the interpreter, torch, the Dask worker) is read from each worker as it is before launch. Under
the replicated strategy every rank holds:

* the tables: ``entities x dim`` and ``relation rows x relation width`` float32 values;
* their optimiser state: one table-sized copy per slot (Adam 2, Adagrad 1, SGD 0);
* one more copy of both: the snapshot a background commit takes (files are streamed from the
  tensors: no copy more), or the checkpoint a resumed segment reads next to the live tables;
* epoch sync: the parameters the epoch started from and a per-row count (model averaging);
* the staged training triples (3 int32 ids each; int64 past 2**31 ids) and the epoch's
  order (one int32 each): all of them under step sync (every rank draws the global batch),
  its shards under epoch sync, plus all of them on rank 0 and where it validates (the
  filter needs every known triple);
* where it validates (full ranking is split over every rank of a gang; a sampled validation
  runs on rank 0): the filter index, 4 int64 per known triple (twice that while it is built),
  and a chunk's scores against its candidates with a comparison's booleans (with per-query
  candidates, ``evaluation.candidates``, the pairs' ids and the rows gathered for a group of
  pairs instead);
* under the sharded strategy (``distributed.strategy: sharded``), the tables and optimiser state
  of its shards only (and every rank's commit copies them, in the background as above), the
  fetched rows and pushed gradients of a step, and the entity-to-shard map;
* a step's buffers, for its share of the batch ``b``: the gathered rows of the positives and
  negatives and their gradients (``2 b (negatives + 2) dim`` floats), or under 1vsAll/KvsAll
  ``queries x entities`` float matrices (``2 b`` queries under 1vsAll, ``b`` under KvsAll; by
  mode and loss, :data:`_MATRICES`) and 3 table-sized gradients.

On a GPU (:func:`gang_workers` asks each worker) the estimate is split (:meth:`RankMemory.on_gpu`):
what lives on the card is checked against its free memory, what stays in host memory (a
commit's copy, the staged triples, the filter index) against the worker's limit (untried).

Checked against measured worker peaks (``bench/memory.py``, docs/distributed.md): rank 0 of two
peaked 3,194 MiB above its start on a 656k-entity TransE d=100 graph with Adam (estimate 3,151)
and 2,168 MiB on a 216k-entity d=200 one (estimate 2,201).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kgpipe.config import RunConfig
from kgpipe.devices import worker_memory
from kgpipe.distributed.gang import live_workers
from kgpipe.errors import ConfigError
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.query_candidates import PAIRS
from kgpipe.training.losses import LOSSES

if TYPE_CHECKING:
    from kgpipe.runs.folder import RunFolder

__all__ = [
    "RankMemory",
    "check_gang_memory",
    "check_test_gang",
    "format_bytes",
    "gang_workers",
    "rank_memory",
    "ranking_memory",
]

#: Dask's nanny restarts a worker whose memory passes this share of its limit
TERMINATE_FRACTION = 0.95
#: the share of a GPU's free memory a rank's estimate may fill (the rest: the caching
#: allocator's fragmentation, cuBLAS workspaces)
CARD_FRACTION = 0.9
_SLOTS = {"adam": 2, "adagrad": 1, "sgd": 0}
#: score-sized matrices a 1vsAll/KvsAll step holds at its peak, by (mode, loss), fitted to
#: measured peaks (``bench/step_memory.py``, session 54): 3.5 more for a distance model, 1
#: for the fused reciprocal softmax of a bilinear model, the most for a loss not measured
_MATRICES = {("1vsall", "cross_entropy"): 2.25, ("1vsall", "bce"): 4.0,
             ("kvsall", "cross_entropy"): 5.25, ("kvsall", "bce"): 4.25}  # fmt: skip


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"  # pragma: no cover


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds beyond its process's start, by part."""

    tables: int
    optimizer: int
    checkpoint: int
    averaging: int
    triples: int
    step: int
    validation: int = 0
    #: of ``validation``, what stays in host memory where the rank trains on a GPU: the filter
    #: index (built from the staged triples) and the staged candidate ids
    validation_host: int = 0

    @property
    def total(self) -> int:
        parts = (self.tables, self.optimizer, self.checkpoint, self.averaging, self.triples)
        return sum(parts) + self.step + self.validation

    def describe(self) -> str:
        parts = [("tables", self.tables), ("optimiser state", self.optimizer),
                 ("checkpoint copy", self.checkpoint), ("model averaging", self.averaging),
                 ("training triples", self.triples), ("step buffers", self.step),
                 ("validation", self.validation)]  # fmt: skip
        return ", ".join(f"{name} {format_bytes(b)}" for name, b in parts if b)

    def on_gpu(self, *, training: bool = True) -> tuple[RankMemory, RankMemory]:
        """``(host, card)``: where a rank that trains (``training``) or ranks on a GPU holds
        each part. On the card: the tables, their optimiser state, the step's buffers, a
        validation chunk's scores, and a training rank's triples and epoch order (moved there
        whole). In host memory: the tables as the model is built (or a checkpoint read into
        it) before it moves to the card, a commit's copy of the tables and their state (a
        checkpoint is written from host memory, in the foreground too; a resume reads it there
        first), the staged triples, the filter index and staged candidate ids."""
        host = RankMemory(
            tables=self.tables, optimizer=0, checkpoint=self.tables + self.optimizer, averaging=0,
            triples=self.triples, step=0, validation=self.validation_host,
            validation_host=self.validation_host,
        )  # fmt: skip
        card = RankMemory(
            tables=self.tables, optimizer=self.optimizer, checkpoint=0, averaging=self.averaging,
            triples=self.triples if training else 0, step=self.step,
            validation=self.validation - self.validation_host,
        )  # fmt: skip
        return host, card


def rank_memory(
    config: RunConfig,
    *,
    num_entities: int,
    num_relations: int,
    num_train: int,
    world: int,
    valid_candidates: tuple[int, int] | None = None,
) -> RankMemory:
    """The estimate of one rank's run-dependent bytes under ``config``; ``valid_candidates``:
    the ``(rows, k)`` of the valid split's staged candidate files (``data.candidates``)."""
    m = config.model
    relation_width = INTERACTIONS.get(m.name)(p=m.p, margin=m.margin).relation_dim(m.dim)
    relation_rows = num_relations * (2 if m.reciprocal else 1)
    d = config.distributed
    sharded = d.strategy == "sharded" and world > 1
    # a sharded rank holds the rows of its shards (ceil(S / W) shards of ceil(N / S) rows)
    held = num_entities
    if sharded:
        held = min(num_entities, -(-d.entity_shards // world) * -(-num_entities // d.entity_shards))
    tables = 4 * (held * m.dim + relation_rows * relation_width)
    slots = _SLOTS.get(config.training.optimizer, 2)
    optimizer = slots * tables
    averaging = 0
    if config.distributed.sync == "epoch" and world > 1:
        averaging = tables + 4 * (num_entities + relation_rows)
    step_sync = config.distributed.sync == "step" or world == 1
    validates = bool(config.evaluation.every)  # rank 0 does (any worker may hold rank 0)
    ids = 4 if max(num_entities, num_relations) <= 2**31 else 8  # int32 if the ids fit
    order = 4 if num_train <= 2**31 else 8  # the epoch's permutation, int32 where it fits
    if step_sync:
        triples = num_train * (3 * ids + order)
    else:  # its shards, and every triple on rank 0 (and where it validates)
        triples = -(-num_train // max(1, world)) * (3 * ids + order) + num_train * 3 * ids
    t = config.training
    batch = -(-t.batch_size // max(1, world))
    if t.mode == "negative_sampling":
        step = 4 * 2 * batch * (t.negatives + 2) * m.dim
        if sharded:  # the fetched rows and the pushed gradients, and the map of the shards
            step = 2 * step + 12 * num_entities
            if d.staleness:  # the cache: at most the rows of the last k steps, not its own
                rows = min(d.staleness * batch * (t.negatives + 2), num_entities - held)
                # its pool grows a quarter at a time (both pools for a moment: covered by the
                # bound on rows, which counts every id a step draws, not the distinct others')
                step += rows * (5 * m.dim + 32)
    else:  # (queries x entities) matrices: scores, the loss's temporaries, their gradients
        bilinear, kv = INTERACTIONS.get(m.name).bilinear, t.mode == "kvsall"
        fused = not kv and m.reciprocal and LOSSES.get(t.loss).softmax and bilinear
        mats = _MATRICES.get((t.mode, t.loss), max(_MATRICES.values())) + 3.5 * (not bilinear)
        mats = 1 if fused else mats
        queries = batch if kv else 2 * batch  # 1vsAll: both sides of a triple
        # and the whole table's gradient and the optimiser's temporaries of its update
        step = int(4 * queries * num_entities * mats) + 3 * 4 * num_entities * m.dim
    args = (config, num_entities, num_train, world, valid_candidates)
    validation, validation_host = _validation(*args) if validates else (0, 0)
    return RankMemory(
        tables=tables,
        optimizer=optimizer,
        # the snapshot a background commit writes while the next epoch trains (every rank of a
        # sharded gang: its shards, and rank 0 the relation part); in the foreground the
        # files are written from the live tables' row blocks, no copy
        checkpoint=(tables + optimizer) if config.checkpoint.background else 0,
        averaging=averaging,
        triples=triples,
        step=step,
        validation=validation,
        validation_host=validation_host,
    )


def _validation(
    config: RunConfig, num_entities: int, num_train: int, world: int,
    files: tuple[int, int] | None = None,
) -> tuple[int, int]:  # fmt: skip
    """The bytes, and of them those in host memory (see :meth:`RankMemory.on_gpu`): the
    filter index (4 int64 per known triple, twice that while it is built) and a chunk's
    scores: float32 against the rank's candidates and the boolean of a comparison (the rank's
    range of entities when a gang splits full ranking, else all of them; a sample and the
    chunk's targets); with per-query candidates, each query's scores and about five int64
    tensors per (query, candidate) pair (ids, query index, filter keys, the draw and its
    shift), and the rows gathered for a group of pairs; with candidate ``files`` ``(rows,
    k)``, also both sides' staged ids (mapped from the run folder: Dask counts the pages)."""
    ev = config.evaluation
    index = 2 * 4 * 8 * num_train
    k = ev.candidates if ev.candidates is not None else files[1] if files else None
    if k is not None:
        ids = 4 if num_entities < 2**31 else 8
        staged = 0 if files is None else 2 * files[0] * files[1] * ids
        pairs = min(PAIRS, ev.batch_size * (1 + k))
        scoring = (4 + 1 + 8 * 5) * ev.batch_size * (1 + k) + 3 * 4 * 2 * config.model.dim * pairs
        return index + staged + scoring, index + staged
    split = world > 1 and (ev.sampled is None or config.distributed.strategy == "sharded")
    candidates = -(-num_entities // world) if split else num_entities
    if ev.sampled is not None:  # the sample and a chunk's targets (sharded: a rank's of them)
        candidates = min(candidates, ev.sampled + ev.batch_size)
    floats = 4 if INTERACTIONS.get(config.model.name).bilinear else 12  # distances: 2 more
    return index + (floats + 1) * ev.batch_size * candidates, index


def ranking_memory(
    config: RunConfig,
    *,
    num_entities: int,
    num_relations: int,
    num_train: int,
    world: int,
    test_candidates: tuple[int, int] | None = None,
) -> RankMemory:
    """One rank of the gang that ranks the test split (:mod:`kgpipe.launch.rank_test`): its
    share of the tables without optimiser state, every training triple's ids (the filter; no
    epoch order), the shard map, and a chunk's ranking as validation counts it (against the
    test split's candidate files ``(rows, k)`` where there are)."""
    m = rank_memory(
        config, num_entities=num_entities, num_relations=num_relations, num_train=num_train,
        world=world,
    )  # fmt: skip
    ids = 4 if max(num_entities, num_relations) <= 2**31 else 8
    sharded = config.distributed.strategy == "sharded" and world > 1
    validation, validation_host = _validation(
        config, num_entities, num_train, world, test_candidates
    )
    return RankMemory(
        tables=m.tables,
        optimizer=0,
        checkpoint=m.tables,  # the checkpoint's tables, read next to the model's
        averaging=0,
        triples=num_train * 3 * ids,
        step=12 * num_entities if sharded else 0,
        validation=validation,
        validation_host=validation_host,
    )


def gang_workers(client: Any, config: RunConfig) -> dict[str, dict[str, Any]]:
    """The workers as :func:`check_gang_memory` takes them: the scheduler's view (memory limit),
    their memory in use read now, and ``gpu`` -- ``{"free", "total"}`` bytes of its card --
    where a rank there would train on a GPU (asked of each worker, as ``training.device``
    resolves there). A worker lost meanwhile keeps the scheduler's figures (its gang fails
    and is retried as after any lost worker)."""
    workers = live_workers(client)
    now = client.run(
        worker_memory, config.training.device, config.distributed.cluster,
        workers=list(workers), on_error="return",
    )  # fmt: skip
    for a, w in workers.items():
        if isinstance(got := now.get(a), dict):
            w["metrics"] = {**(w.get("metrics") or {}), "memory": got["rss"]}
            w.update({"gpu": got["gpu"]} if got["gpu"] else {})
    return workers


def check_training_gang(
    config: RunConfig,
    workers: dict[str, dict[str, Any]],
    *,
    segment: tuple[int, int],
    resumed: bool = False,
    **sizes: Any,
) -> RunConfig:
    """:func:`check_gang_memory` for a gang that trains the epochs after ``segment[0]`` up to
    ``segment[1]`` (``sizes``: the other keyword arguments); returns the config its ranks run.

    A background commit's copy is counted where the segment commits before its end (the last
    commit is waited for at once, with no copy), and where it resumes: its ranks read the
    checkpoint next to the live tables. Where the copy is all that does not fit, the gang
    commits in the foreground (training waits for each commit) instead of being refused."""
    c = config.checkpoint
    start, until = segment
    foreground, copied = (
        config.model_copy(update={"checkpoint": c.model_copy(update={"background": b})})
        for b in (False, True)
    )
    # ``resumed``: the ranks read a checkpoint (a warm start's epoch 0 too): +402 MiB measured
    counted = copied if resumed or start else foreground
    if c.background and any(e % c.every == 0 for e in range(start + 1, until)):
        try:
            check_gang_memory(config, workers, **sizes)
            return config
        except ConfigError:
            pass
        check_gang_memory(counted, workers, **sizes)  # refused when it does not fit either
        return foreground
    check_gang_memory(counted, workers, **sizes)  # no commit in the background to count
    return config


def check_gang_memory(
    config: RunConfig,
    workers: dict[str, dict[str, Any]],
    *,
    num_entities: int = 0,
    num_relations: int = 0,
    num_train: int = 0,
    world: int = 1,
    valid_candidates: tuple[int, int] | None = None,
    need: RankMemory | None = None,
) -> RankMemory:
    """Refuse to launch when one rank would not fit a worker's memory limit.

    ``workers``: the scheduler's workers (each with ``memory_limit``, 0 for none, and
    ``metrics.memory``, its resident bytes now), with ``gpu`` where the ranks train on a
    GPU (:func:`gang_workers`): the card then holds the tables, checked against its free
    memory, and the limit is checked against the host's part only. ``need``: the estimate of
    another gang than a training one (:func:`ranking_memory`; the sizes are then not used).
    Returns the estimate."""
    training = need is None
    if need is None:
        need = rank_memory(
            config, num_entities=num_entities, num_relations=num_relations, num_train=num_train,
            world=world, valid_candidates=valid_candidates,
        )  # fmt: skip
    sharded = config.distributed.strategy == "sharded" and world > 1
    short: list[tuple[str, int, int, RankMemory]] = []
    short_card: list[tuple[str, dict[str, int], RankMemory]] = []
    for address, info in workers.items():
        gpu: dict[str, int] | None = info.get("gpu")  # its ranks train on this card
        host, card = need.on_gpu(training=training) if gpu else (need, None)
        if gpu and card is not None and card.total > int(gpu["free"] * CARD_FRACTION):
            short_card.append((address, gpu, card))
        limit = int(info.get("memory_limit") or 0)
        if not limit:
            continue
        now = int((info.get("metrics") or {}).get("memory") or 0)
        usable = int(limit * TERMINATE_FRACTION)
        if now + host.total > usable:
            short.append((address, limit, now, host))
    if short_card:
        address, gpu, card = min(short_card, key=lambda s: s[1]["free"])
        raise ConfigError(
            f"one rank needs about {format_bytes(card.total)} on its GPU ({card.describe()}), "
            f"but the GPU of worker {address} has {format_bytes(gpu['free'])} free of "
            f"{format_bytes(gpu['total'])} (a rank may fill {CARD_FRACTION:.0%} of it; "
            f"{len(short_card)} of {len(workers)} worker(s) short): "
            + (
                "each rank holds its shards of the entity table -- add workers (one per GPU) "
                "or use a smaller model.dim"
                if sharded
                else "every rank holds the whole model under the replicated strategy -- use "
                "distributed.strategy: sharded or a smaller model.dim"
            )
        )
    if short:
        address, limit, now, host = min(short, key=lambda s: s[1] - s[2])
        raise ConfigError(
            f"one rank needs about {format_bytes(host.total)} ({host.describe()}) on top of the "
            f"{format_bytes(now)} its worker holds already, but the worker's memory limit is "
            f"{format_bytes(limit)} (Dask restarts a worker past {TERMINATE_FRACTION:.0%} of it; "
            f"{len(short)} of {len(workers)} worker(s), e.g. {address}): "
            + (
                "each rank holds its shards of the entity table -- raise "
                "distributed.memory_limit, add workers, or use a smaller model.dim"
                if sharded
                else "every rank holds the whole model under the replicated strategy -- use "
                "distributed.strategy: sharded, raise distributed.memory_limit, or use a "
                "smaller model.dim"
            )
        )
    return need


def check_test_gang(run: RunFolder, workers: dict[str, dict[str, Any]], world: int) -> RankMemory:
    """:func:`check_gang_memory` for the gang that ranks ``run``'s test split."""
    sizes = {"num_entities": run.num_entities, "num_relations": run.num_relations,
             "num_train": run.num_train}  # fmt: skip
    test = run.candidate_shape("test")
    need = ranking_memory(run.config, **sizes, world=world, test_candidates=test)
    return check_gang_memory(run.config, workers, world=world, need=need)
