"""Embeddings of a sharded run, written and read one shard at a time.

A sharded run (``distributed.strategy: sharded``) exports its entity embeddings as a Parquet
dataset with one part per shard of the entity table::

    embeddings/entities/part-000003.parquet   # id, label, embedding (list<float32>)
    embeddings/relations.parquet
    embeddings/model.json                      # spec, scoring, "layout": "sharded", parts

Each part is written from its shard's tensors in the committed checkpoint, so the export holds
one shard at a time. :class:`ShardedEmbeddings` answers a query ``(h, r, ?)`` or ``(?, r, t)``
the same way: it scores the candidates part by part and keeps a running top k, never the whole
table (``kgpipe predict`` uses it for such a run).
"""

from __future__ import annotations

import io
import json
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from safetensors import safe_open
from torch import Tensor

from kgpipe.checkpoint import Checkpoint, CheckpointStore
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import RunError
from kgpipe.export import ENTITY_PARTS, clear_export, model_info, relation_labels, table_parquet
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.models.spec import ModelSpec
from kgpipe.sharded_tensors import SHARD_PREFIX, shard_key
from kgpipe.storage import RetryPolicy, Store

__all__ = ["ShardedEmbeddings", "export_sharded"]

PARTS = ENTITY_PARTS


def export_sharded(
    checkpoints: CheckpointStore,
    ckpt: Checkpoint,
    vocab: Vocabulary,
    spec: ModelSpec,
    out_url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> list[str]:
    """Write the embeddings of sharded checkpoint ``ckpt`` under ``out_url``, a part per shard;
    returns the URLs written (``model.json`` last)."""
    store = Store(out_url, storage_options, retry=retry)
    clear_export(store)  # parts of an earlier export with more shards were read as this one's
    state, _ = checkpoints.load_selected(  # the file with the replicated part (all if unsaid)
        ckpt, lambda k: k == "table.relation", lambda info: info.get("replicated", True)
    )
    parts: list[str] = []
    info = {**model_info(spec), "layout": "sharded", "entities": f"{PARTS}/part-*.parquet"}
    meta = {"kgpipe": json.dumps(info)}
    written = []
    entities = vocab.entities
    for sid, shard_ids, rows in _shards(checkpoints, ckpt):
        ids = shard_ids.numpy()
        labels = [entities[i] for i in ids.tolist()]
        rel = f"{PARTS}/part-{sid:06d}.parquet"
        store.write_bytes(rel, table_parquet(ids, labels, rows.numpy(), meta))
        written.append(store.url_of(rel))
        parts.append(rel.removeprefix(f"{PARTS}/"))
    if not parts:
        raise RunError(f"{ckpt.url}: not a sharded checkpoint (no shard tensors)")
    relation = state.tables["relation"].numpy()
    rel_labels = relation_labels(vocab, spec)
    store.write_bytes(
        "relations.parquet",
        table_parquet(
            np.arange(relation.shape[0]), rel_labels, relation, meta, inverse=len(vocab.relations)
        ),
    )
    written.append(store.url_of("relations.parquet"))
    store.write_json("model.json", {**info, "parts": len(parts), "part_files": parts})
    written.append(store.url_of("model.json"))
    return written


def _shards(checkpoints: CheckpointStore, ckpt: Checkpoint) -> Iterator[tuple[int, Tensor, Tensor]]:
    """``(shard, ids, rows)`` of each shard of a sharded checkpoint, one shard in memory at a
    time (read from the verified files; the optimiser state is not read)."""
    with checkpoints.verified_files(ckpt) as paths:
        if paths is None:
            raise RunError(f"{ckpt.url}: checkpoint is incomplete or corrupt")
        for path in paths.values():
            with safe_open(path, framework="pt") as f:
                keys = [k for k in f.keys() if k.startswith(SHARD_PREFIX)]  # noqa: SIM118
                for sid in sorted({int(k.split(".")[1]) for k in keys}):
                    ids = f.get_tensor(shard_key(sid, "ids"))
                    yield sid, ids, f.get_tensor(shard_key(sid, "table.entity"))


def _rows(table: Any) -> tuple[np.ndarray, Tensor]:
    ids = table.column("id").to_numpy().copy()  # writable: torch shares it
    if not len(ids):  # a shard with no entity (more shards than entities)
        return ids, torch.zeros(0, 0)
    flat = table.column("embedding").combine_chunks().flatten().to_numpy()
    return ids, torch.from_numpy(flat.reshape(len(ids), -1).copy())


class ShardedEmbeddings:
    """A sharded export, read part by part."""

    def __init__(self, store: Store, info: dict[str, Any]) -> None:
        self.store = store
        self.spec = ModelSpec.from_json(json.dumps(info["model"]))
        self.interaction = INTERACTIONS.get(self.spec.name)(p=self.spec.p, margin=self.spec.margin)
        # the parts model.json names (an export before they were named: all, if as many)
        listed = sorted(p for p in store.list(PARTS) if p.endswith(".parquet"))
        self.parts = list(info.get("part_files") or listed)
        if len(self.parts) != info.get("parts", len(self.parts)) or not set(self.parts) <= set(
            listed
        ):
            raise RunError(
                f"{store.url}: model.json names {info.get('parts')} entity parts, and "
                f"{PARTS}/ holds {len(listed)} ({', '.join(listed[:4])}): export the run again "
                "(kgpipe export RUN --out URL)"
            )
        _, self.relations = _rows(self._read("relations.parquet"))

    @classmethod
    def open(
        cls, url: str, storage_options: dict[str, Any] | None = None
    ) -> ShardedEmbeddings | None:
        """The sharded export under ``url``, or ``None`` if it holds another layout (or none)."""
        store = Store(url, storage_options)
        if not store.exists("model.json"):
            return None
        info = json.loads(store.read_text("model.json"))
        return cls(store, info) if info.get("layout") == "sharded" else None

    def _read(self, rel: str, columns: list[str] | None = None) -> Any:
        # ParquetFile, not read_table: pyarrow 25's dataset reader left threads that aborted
        # the process at exit in ~1 of 4 runs ("terminate called without an active
        # exception", apache/arrow#34314); this reader never did (0 of 30)
        return pq.ParquetFile(io.BytesIO(self.store.read_bytes(rel))).read(columns=columns)

    def _part(self, name: str) -> tuple[np.ndarray, Tensor]:
        return _rows(self._read(f"{PARTS}/{name}"))

    def entity(self, entity_id: int) -> Tensor:
        """The embedding row of one entity (found by reading the parts' id columns)."""
        for name in self.parts:
            ids = self._read(f"{PARTS}/{name}", columns=["id"]).column("id").to_numpy()
            hit = np.flatnonzero(ids == entity_id)
            if hit.size:
                return self._part(name)[1][int(hit[0])]
        raise RunError(f"{self.store.url}: entity id {entity_id} is in no part")

    def top(
        self,
        anchor: int,
        relation: int,
        side: str,
        k: int,
        exclude: Collection[int] = (),
    ) -> tuple[list[float], list[int]]:
        """The ``k`` best-scored answers of ``(anchor, relation, ?)`` (``side="tail"``) or
        ``(?, relation, anchor)`` (``"head"``), best first, leaving out ``exclude``."""
        spec, inter = self.spec, self.interaction
        a = self.entity(anchor).unsqueeze(0)
        r = self.relations[relation].unsqueeze(0)
        if side == "head" and spec.reciprocal:
            r, side = self.relations[relation + spec.num_relations].unsqueeze(0), "tail"
        best_s = torch.empty(0)
        best_i = torch.empty(0, dtype=torch.long)
        drop = torch.tensor(sorted(exclude), dtype=torch.long)
        with torch.no_grad():
            for name in self.parts:
                ids_np, cand = self._part(name)
                if not len(ids_np):
                    continue
                ids = torch.from_numpy(ids_np)
                scores = (
                    inter.score_tails(a, r, cand)
                    if side == "tail"
                    else inter.score_heads(r, a, cand)
                )[0].float()
                if drop.numel():
                    scores[torch.isin(ids, drop)] = float("-inf")
                best_s = torch.cat((best_s, scores))
                best_i = torch.cat((best_i, ids))
                keep = torch.topk(best_s, min(k, best_s.numel())).indices
                best_s, best_i = best_s[keep], best_i[keep]
        # left out: the excluded; a NaN score (a broken row) stays, first, as in the whole
        # model's top-k (dropped, the finite answers its NaN pushed out were lost: no answer)
        keep = ~torch.isneginf(best_s)
        return best_s[keep].tolist(), best_i[keep].tolist()
