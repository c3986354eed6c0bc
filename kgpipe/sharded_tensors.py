"""How a sharded entity table is stored: one set of tensors per shard, any world size.

A sharded checkpoint (``distributed.strategy: sharded``) holds, per shard ``s`` of the entity
table, ``shard.<s>.ids`` (its entity ids, ascending), ``shard.<s>.table.entity`` (their rows) and
``shard.<s>.optim.entity.<slot>`` (their optimiser state), in files written by the ranks that
own the shards; the replicated part (the relation table, its optimiser state, the step count)
is written once, under the usual names. A reader on one process assembles the whole table;
a rank of a sharded gang reads only its own shards, whatever the world size that wrote them.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "SHARD_PREFIX",
    "assemble_shards",
    "is_optimiser_state",
    "local_rows",
    "shard_key",
    "split_shards",
]

#: tensors of one shard of a sharded entity table: ``shard.<id>.<ids|table.entity|optim...>``
SHARD_PREFIX = "shard."


def shard_key(shard: int, name: str) -> str:
    """The name of a shard's tensor in a sharded checkpoint: ``ids`` (its entity ids, ascending),
    ``table.entity`` (their rows) or ``optim.entity.<slot>`` (their optimiser state)."""
    return f"{SHARD_PREFIX}{shard:06d}.{name}"


def assemble_shards(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The whole entity table and its optimiser state from a sharded checkpoint's shards (the
    other tensors as they are): what a reader on one process, or a replicated run, needs."""
    out = {k: v for k, v in tensors.items() if not k.startswith(SHARD_PREFIX)}
    shards: dict[str, dict[str, Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith(SHARD_PREFIX):
            sid, _, name = k[len(SHARD_PREFIX) :].partition(".")
            shards.setdefault(sid, {})[name] = v
    num = sum(int(parts["ids"].numel()) for parts in shards.values())
    for parts in shards.values():
        ids = parts["ids"]
        for name, v in parts.items():
            if name == "ids":
                continue
            if name not in out:
                out[name] = v.new_zeros((num, *v.shape[1:]))
            out[name][ids] = v
    return out


def split_shards(
    own: Tensor, shard_of_own: Tensor, shards: list[int], tensors: dict[str, Tensor]
) -> dict[str, Tensor]:
    """A rank's local ``tensors`` (rows in the order of its entity ids ``own``: its ``shards``
    one after the other, ``shard_of_own`` the shard of each row; names such as
    ``table.entity``) as the tensors of each shard: views of contiguous row blocks, no copy
    (on a GPU, a copy to the host)."""
    out: dict[str, Tensor] = {}
    start = 0
    for s in shards:
        size = int((shard_of_own == s).sum())
        block = slice(start, start + size)
        if size and not bool((shard_of_own[block] == s).all()):
            raise ValueError("the local table does not hold its shards as contiguous blocks")
        out[shard_key(s, "ids")] = own[block].cpu()
        for name, v in tensors.items():
            out[shard_key(s, name)] = v[block].cpu()
        start += size
    return out


def local_rows(tensors: dict[str, Tensor], own: Tensor) -> dict[str, Tensor]:
    """From the shard tensors of a checkpoint (those covering ``own``), the rows of the entity
    ids ``own`` in that order, by name (``table.entity``, ``optim.entity.exp_avg``, ...)."""
    out: dict[str, Tensor] = {}
    pieces: dict[str, list[tuple[Tensor, Tensor]]] = {}
    for k, v in tensors.items():
        if not k.startswith(SHARD_PREFIX):
            continue
        sid, _, name = k[len(SHARD_PREFIX) :].partition(".")
        if name != "ids":
            pieces.setdefault(name, []).append((tensors[shard_key(int(sid), "ids")], v))
    for name, parts in pieces.items():
        ids = torch.cat([i for i, _ in parts])
        values = torch.cat([v for _, v in parts])
        if not torch.equal(ids, own.cpu()):  # the shards' order on this rank, not the file's
            order = torch.argsort(ids)
            pos = torch.searchsorted(ids[order], own.cpu()).clamp_(max=max(0, ids.numel() - 1))
            if ids.numel() != own.numel() or not torch.equal(ids[order][pos], own.cpu()):
                raise ValueError(
                    f"the checkpoint's shards do not hold exactly this rank's rows ({name})"
                )
            values = values[order[pos]]
        out[name] = values
    return out


def is_optimiser_state(key: str) -> bool:
    """Whether checkpoint tensor ``key`` is optimiser state (not a table, a counter or RNG)."""
    return key.startswith("optim.") or (key.startswith(SHARD_PREFIX) and ".optim." in key)
