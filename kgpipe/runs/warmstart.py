"""Warm starts: initialise a new run's tables from a previous model, by label.

Entities and relations known to both vocabularies keep their previous vectors (ids re-mapped);
new ones keep the new model's seeded initialisation; removed ones are dropped. For reciprocal
models the inverse-relation rows are mapped the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from kgpipe.checkpoint import TrainState
from kgpipe.data.vocab import Vocabulary
from kgpipe.errors import RunError
from kgpipe.runs.folder import RunFolder
from kgpipe.runs.read import load_run
from kgpipe.training.optim import build_optimizer

__all__ = ["WarmStart", "commit_warm_start", "warm_start_tables"]


@dataclass(frozen=True)
class WarmStart:
    entity: Tensor
    relation: Tensor
    kept_entities: int
    new_entities: int
    dropped_entities: int
    kept_relations: int
    new_relations: int
    dropped_relations: int

    def summary(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


def _map(old: Sequence[str], new: Sequence[str]) -> tuple[Tensor, Tensor]:
    """(new ids, old ids) of the labels present in both."""
    where = {label: i for i, label in enumerate(old)}
    pairs = [(j, where[label]) for j, label in enumerate(new) if label in where]
    if not pairs:
        return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
    t = torch.tensor(pairs, dtype=torch.long)
    return t[:, 0], t[:, 1]


def warm_start_tables(
    old_vocab: Vocabulary,
    old_entity: Tensor,
    old_relation: Tensor,
    new_vocab: Vocabulary,
    new_entity: Tensor,
    new_relation: Tensor,
) -> WarmStart:
    """New tables: ``new_*`` (the seeded initialisation) with known rows copied from ``old_*``."""
    if old_entity.shape[1] != new_entity.shape[1] or old_relation.shape[1] != new_relation.shape[1]:
        raise ValueError(
            f"cannot warm-start: the previous model's dimensions ({old_entity.shape[1]}, "
            f"{old_relation.shape[1]}) differ from the new ones ({new_entity.shape[1]}, "
            f"{new_relation.shape[1]})"
        )
    entity = new_entity.clone()
    relation = new_relation.clone()
    e_new, e_old = _map(old_vocab.entities, new_vocab.entities)
    entity[e_new] = old_entity[e_old]
    r_new, r_old = _map(old_vocab.relations, new_vocab.relations)
    relation[r_new] = old_relation[r_old]
    n_old, n_new = len(old_vocab.relations), len(new_vocab.relations)
    reciprocal_old = old_relation.shape[0] == 2 * n_old
    if reciprocal_old and new_relation.shape[0] == 2 * n_new:
        relation[r_new + n_new] = old_relation[r_old + n_old]
    kept_e, kept_r = int(e_new.numel()), int(r_new.numel())
    return WarmStart(
        entity,
        relation,
        kept_entities=kept_e,
        new_entities=len(new_vocab.entities) - kept_e,
        dropped_entities=len(old_vocab.entities) - kept_e,
        kept_relations=kept_r,
        new_relations=n_new - kept_r,
        dropped_relations=n_old - kept_r,
    )


def commit_warm_start(run: RunFolder, vocab: Vocabulary, source: str) -> dict[str, int]:
    """Commit an epoch-0 checkpoint of ``run`` whose tables come from the model of the run
    folder at ``source``, matched by label; returns the counts of kept, new and dropped rows."""
    previous = load_run(source, run.config.run.storage_options)
    cfg = run.config
    model = run.new_model()
    try:
        ws = warm_start_tables(
            previous.vocab,
            previous.model.entity.data,
            previous.model.relation.data,
            vocab,
            model.entity.data,
            model.relation.data,
        )
    except ValueError as err:
        raise RunError(f"{source}: {err}") from None
    tables = {"entity": ws.entity, "relation": ws.relation}
    t = cfg.training
    optimizer = build_optimizer(t.optimizer, tables, lr=t.lr, betas=t.betas, eps=t.eps)
    state = TrainState(0, 0, tables, optimizer.state_dict(), [], torch.get_rng_state())
    meta = {**run.manifest_meta(1), "warm_start": {"source": source, **ws.summary()}}
    run.checkpoints().save(state, meta)
    return ws.summary()
