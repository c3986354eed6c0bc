"""Filtered ranking equals a brute-force reference, ties included."""

from __future__ import annotations

import math

import pytest
import torch

from kgpipe.config import ModelConfig
from kgpipe.evaluation import FilterIndex, evaluate, rank_metrics
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.models.model import KGEModel


def _random_triples(n: int, ne: int, nr: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack(
        (
            torch.randint(0, ne, (n,), generator=g),
            torch.randint(0, nr, (n,), generator=g),
            torch.randint(0, ne, (n,), generator=g),
        ),
        1,
    )


def _brute_force(model: KGEModel, test: torch.Tensor, known: list[torch.Tensor]) -> dict:
    """Per-triple Python loops: score every candidate triple one by one."""
    true = {tuple(x) for k in known for x in k.tolist()}
    ne = model.spec.num_entities
    ranks = {"head": [], "tail": []}
    for h, r, t in test.tolist():
        for side in ("tail", "head"):
            cands = []
            for e in range(ne):
                trip = (h, r, e) if side == "tail" else (e, r, t)
                if model.spec.reciprocal and side == "head":
                    q = torch.tensor([[t, r + model.spec.num_relations, e]])
                else:
                    q = torch.tensor([trip])
                cands.append((e, trip, float(model.score_triples(q)[0])))
            target = t if side == "tail" else h
            s_true = next(s for e, _, s in cands if e == target)
            others = [s for e, trip, s in cands if e != target and trip not in true]
            better = sum(s > s_true for s in others)
            equal = sum(s == s_true for s in others)
            ranks[side].append(1 + better + equal / 2)
    both = ranks["head"] + ranks["tail"]

    def metrics(rs: list[float]) -> dict:
        return {
            "mrr": sum(1 / x for x in rs) / len(rs),
            "mr": sum(rs) / len(rs),
            **{f"hits@{k}": sum(x <= k for x in rs) / len(rs) for k in (1, 3, 10)},
        }

    return {**metrics(both), "head": metrics(ranks["head"]), "tail": metrics(ranks["tail"])}


@pytest.mark.parametrize("name", sorted(INTERACTIONS))
@pytest.mark.parametrize("reciprocal", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_matches_brute_force(name: str, reciprocal: bool, ties: bool) -> None:
    ne, nr = 23, 4
    model = KGEModel.build(
        ModelConfig(name=name, dim=6, reciprocal=reciprocal, init="uniform", init_scale=1.0),
        num_entities=ne,
        num_relations=nr,
        seed=7,
    )
    if ties:
        # coarse values make many exactly tied scores; duplicated rows make identical entities
        with torch.no_grad():
            model.entity.copy_((model.entity * 2).round() / 2)
            model.entity[5:10] = model.entity[4]
            if name != "rotate":
                model.relation.copy_(model.relation.round())
            else:
                model.relation.copy_((model.relation / (torch.pi / 2)).round() * (torch.pi / 2))
    train = _random_triples(60, ne, nr, 1)
    valid = _random_triples(10, ne, nr, 2)
    test = torch.cat((_random_triples(15, ne, nr, 3), train[:3]))
    index = FilterIndex.from_triples([train, valid, test], nr)
    ref = _brute_force(model, test, [train, valid, test])
    for bs in (1, 4, 1000):
        got = evaluate(model, test, index, batch_size=bs)
        for key in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
            assert got[key] == pytest.approx(ref[key], abs=1e-12), key
            for side in ("head", "tail"):
                assert got[side][key] == pytest.approx(ref[side][key], abs=1e-12)
        assert got["candidates"] == "all"
    if ties:
        assert any(r != math.floor(r) for r in _ranks(model, test, index))


def _ranks(model: KGEModel, test: torch.Tensor, index: FilterIndex) -> list[float]:
    from kgpipe.evaluation import realistic_ranks

    h, r, t = test.T
    scores = model.score_all_tails(h, r)
    rows, cols = index.answers("tail", h, r)
    return realistic_ranks(scores, t, rows, cols).tolist()


def test_rank_metrics_hand_computed() -> None:
    m = rank_metrics(torch.tensor([1.0, 2.0, 4.0, 10.5]))
    assert m["mrr"] == pytest.approx((1 + 0.5 + 0.25 + 1 / 10.5) / 4)
    assert m["mr"] == pytest.approx(17.5 / 4)
    assert m["hits@1"] == 0.25 and m["hits@3"] == 0.5 and m["hits@10"] == 0.75


def test_sampled_mode_is_labelled_and_exact_against_its_candidates() -> None:
    ne, nr = 40, 3
    model = KGEModel.build(
        ModelConfig(name="distmult", dim=4, init="uniform", init_scale=1.0),
        num_entities=ne,
        num_relations=nr,
        seed=0,
    )
    train = _random_triples(100, ne, nr, 5)
    test = _random_triples(12, ne, nr, 6)
    index = FilterIndex.from_triples([train, test], nr)
    full = evaluate(model, test, index)
    sampled = evaluate(model, test, index, sampled=ne * 10)  # more than all: same as full
    assert sampled["candidates"] == f"sampled-{ne}"
    assert sampled["mrr"] == pytest.approx(full["mrr"])
    small = evaluate(model, test, index, sampled=5)
    assert small["candidates"] == "sampled-5"
    assert small["mr"] <= 6.0  # at most 5 competitors
    assert small["mrr"] >= full["mrr"]


def test_filter_index_answers() -> None:
    tr = torch.tensor([[0, 0, 1], [0, 0, 2], [1, 0, 2], [0, 1, 1]])
    index = FilterIndex.from_triples([tr, tr[:1]], 2)
    rows, cols = index.answers("tail", torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]))
    assert sorted(zip(rows.tolist(), cols.tolist(), strict=True)) == [(0, 1), (0, 2), (1, 2)]
    rows, cols = index.answers("head", torch.tensor([2]), torch.tensor([0]))
    assert sorted(cols.tolist()) == [0, 1]
