"""What a run's trained parameters depend on: the config hash, and the differences between two
configs that a resume must refuse."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kgpipe.config.run import RunConfig
from kgpipe.training.schedules import SCHEDULES

__all__ = [
    "RESUMABLE_CHANGES",
    "config_hash",
    "config_hashes",
    "hashed_view",
    "lossy_distribution",
    "training_differences",
]

# Sections that may differ between a run and its resumption (how it runs, not what it computes;
# under a schedule that follows validation, evaluation.every and .sampled drive the learning
# rate and may not change). `tracking` (where the run is reported) is not hashed either, so
# every run from before it existed keeps its hash.
RESUMABLE_CHANGES = ("distributed", "checkpoint", "fault_tolerance", "evaluation", "tracking")


def hashed_view(
    config: RunConfig, *, sampled_under_patience: bool = True, lossy: bool = True
) -> dict[str, Any]:
    """The part of ``config`` that determines the trained parameters, as plain data: everything
    but the run's placement (``run.root``, ``run.name``, storage options), the process settings
    and :data:`RESUMABLE_CHANGES` (less ``evaluation.every`` and ``.sampled`` under the plateau
    schedule, and less :func:`lossy_distribution`)."""
    data = config.model_dump(mode="json")
    for section in RESUMABLE_CHANGES:
        data.pop(section, None)
    data["run"] = {"seed": config.run.seed}
    data["data"].pop("storage_options", None)
    for key in ("block_size", "memory_budget", "spill_dir"):  # how the files are read, not
        data["data"].pop(key, None)  # what they hold
    training = data["training"]
    # how the products are computed, not what is trained: a run may resume on another device,
    # where precision auto can resolve differently (and older runs have no precision at all)
    training.pop("precision", None)
    training.pop("device", None)
    training.pop("allocator", None)  # where freed memory goes, not what is trained
    # the thread count may change on resume (the process shares its machine differently); kept
    # as None so that runs from before it was left out keep their hash
    training["threads"] = None
    if SCHEDULES.get(config.training.schedule).follows_validation:
        # the validations drive the learning rate: when and on what they run is training
        data["evaluation"] = {
            "every": config.evaluation.every,
            "sampled": config.evaluation.sampled,
        }
    else:  # runs from before the plateau schedule keep their hash
        training.pop("plateau", None)
    ev = config.evaluation
    if data["data"].get("candidates") is None:  # runs from before data.candidates keep their
        data["data"].pop("candidates", None)  # hash; where set, a resume keeps the staged files
    if ev.candidates is not None and (ev.patience or "evaluation" in data):
        # per-query MRRs run far above full ranking's: early stopping (and a schedule that
        # follows validation) must not compare one protocol's validations with the other's.
        # Only set where candidates are, so that every older run keeps its hash.
        data.setdefault("evaluation", {}).update(
            candidates=ev.candidates, candidates_seed=ev.candidates_seed
        )
    if ev.sampled is not None and ev.patience and sampled_under_patience:
        # sampled MRRs run above full ranking's too: early stopping (and the best checkpoint
        # it keeps) compared the two after a resume that set or unset evaluation.sampled
        data.setdefault("evaluation", {})["sampled"] = ev.sampled
    if config.data.split is None:  # runs from before data.split existed keep their hash
        data["data"].pop("split", None)
    if data["data"].get("header") == "auto":
        # what `auto` decided is in data.json and the staged data a resume reuses; runs from
        # when the default was false keep their hash and resume under the new default
        data["data"]["header"] = False
    if not config.model.dropout.active:  # runs from before dropout existed keep their hash
        data["model"].pop("dropout", None)
    if lossy and (settings := lossy_distribution(config)):  # only where set: others keep
        data["distributed"] = settings  # their hash
    return data


def lossy_distribution(config: RunConfig) -> dict[str, Any]:
    """The ``distributed`` settings that change what a gang trains (single-process training
    is what step sync without compression or staleness equals): per-epoch model averaging,
    lossy compression, bounded staleness. Empty where none is set."""
    dist = config.distributed
    out: dict[str, Any] = {}
    if dist.sync != "step":
        out["sync"] = dist.sync
    if dist.compression != "none":
        out["compression"] = dist.compression
        if dist.compression == "topk":
            out["topk_ratio"] = dist.topk_ratio
    if dist.strategy == "sharded" and dist.staleness:
        out["staleness"] = dist.staleness
    return out


def config_hash(config: RunConfig, **view: bool) -> str:
    """SHA-256 of :func:`hashed_view` (recorded in every checkpoint manifest)."""
    blob = json.dumps(hashed_view(config, **view), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def config_hashes(config: RunConfig) -> set[str]:
    """Every hash ``config`` has had: :func:`config_hash`, and as kgpipe hashed it before
    ``evaluation.sampled`` counted under ``evaluation.patience`` and before
    :func:`lossy_distribution` counted (a retrain series recorded with an older one is the same
    recipe)."""
    return {
        config_hash(config, sampled_under_patience=a, lossy=b)
        for a in (True, False)
        for b in (True, False)
    }


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def training_differences(old: RunConfig, new: RunConfig) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` of every setting that differs between two configs
    and changes what is trained (the keys of :func:`hashed_view`); empty when the configs have
    the same :func:`config_hash`."""
    a, b = _leaves(hashed_view(old)), _leaves(hashed_view(new))
    missing = object()
    return [
        (key, a.get(key), b.get(key))
        for key in sorted(set(a) | set(b))
        if a.get(key, missing) != b.get(key, missing)
    ]
