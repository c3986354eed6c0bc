"""Filtered ranking equals a brute-force reference, ties included."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from kgpipe.config import ModelConfig
from kgpipe.evaluation import FilterIndex, evaluate, rank_metrics, realistic_ranks
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


def _brute_force(
    model: KGEModel, test: torch.Tensor, known: list[torch.Tensor], among: set[int] | None = None
) -> dict:
    """Per-triple Python loops: score every candidate triple one by one (the candidates: every
    entity, or those ``among``)."""
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
            others = [
                s
                for e, trip, s in cands
                if e != target and trip not in true and (among is None or e in among)
            ]
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


def _case(name: str, reciprocal: bool, ties: bool) -> tuple[KGEModel, torch.Tensor, list]:
    """A small model (with many exact ties when ``ties``), its test triples and known sets."""
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
    return model, test, [train, valid, test]


@pytest.mark.parametrize("name", sorted(INTERACTIONS))
@pytest.mark.parametrize("reciprocal", [False, True])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("block", [None, 5])
def test_matches_brute_force(
    name: str, reciprocal: bool, ties: bool, block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against every entity at once, and in blocks of 5 candidates (the path of graphs larger
    than a block: the target's score from a product against the targets' rows)."""
    import kgpipe.evaluation as ev

    blocked: list[bool] = []
    if block is not None:
        monkeypatch.setattr(ev, "BLOCK", block)
        inner = ev._blocked_ranks

        def spy(*args: object) -> object:
            got = inner(*args)  # type: ignore[arg-type]
            blocked.append(got is not None)
            return got

        monkeypatch.setattr(ev, "_blocked_ranks", spy)
    model, test, known = _case(name, reciprocal, ties)
    index = FilterIndex.from_triples(known, model.spec.num_relations)
    ref = _brute_force(model, test, known)
    for bs in (1, 4, 1000):
        got = evaluate(model, test, index, batch_size=bs)
        for key in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
            assert got[key] == pytest.approx(ref[key], abs=1e-12), key
            for side in ("head", "tail"):
                assert got[side][key] == pytest.approx(ref[side][key], abs=1e-12)
        assert got["candidates"] == "all"
    if ties:
        assert any(r != math.floor(r) for r in _ranks(model, test, index))
    if block is not None:
        # the blocks counted; a chunk whose small product rounds its targets' scores unlike
        # their blocks (tiny shapes take other kernels) fell back to the whole matrix
        assert any(blocked), blocked


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


@pytest.mark.parametrize("name", sorted(INTERACTIONS))
@pytest.mark.parametrize("reciprocal", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_sampled_ranks_match_brute_force_and_score_only_the_sample(
    name: str, reciprocal: bool, ties: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the seeded sample only (targets and known answers in or out of it, ties), and
    a chunk is scored against the sample and its targets, not against every entity."""
    from kgpipe.evaluation import sample_candidates

    model, test, known = _case(name, reciprocal, ties)
    index = FilterIndex.from_triples(known, model.spec.num_relations)
    k = 7
    ref = _brute_force(model, test, known, among=set(sample_candidates(23, k).tolist()))
    widths: list[int] = []
    for method in ("score_all_tails", "score_all_heads"):
        inner = getattr(model, method)

        def spy(a: torch.Tensor, b: torch.Tensor, c: object = None, inner: Any = inner) -> Any:
            got = inner(a, b, c)
            widths.append(int(got.shape[1]))
            return got

        monkeypatch.setattr(model, method, spy)
    for bs in (1, 4, 1000):
        widths.clear()
        got = evaluate(model, test, index, batch_size=bs, sampled=k)
        assert got["candidates"] == f"sampled-{k}"
        for key in ("mrr", "mr", "hits@1", "hits@3", "hits@10"):
            assert got[key] == pytest.approx(ref[key], abs=1e-12), key
            for side in ("head", "tail"):
                assert got[side][key] == pytest.approx(ref[side][key], abs=1e-12)
        assert widths and max(widths) <= k + bs, widths  # not the 23 entities


def test_filter_index_answers() -> None:
    tr = torch.tensor([[0, 0, 1], [0, 0, 2], [1, 0, 2], [0, 1, 1]])
    index = FilterIndex.from_triples([tr, tr[:1]], 2)
    rows, cols = index.answers("tail", torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]))
    assert sorted(zip(rows.tolist(), cols.tolist(), strict=True)) == [(0, 1), (0, 2), (1, 2)]
    rows, cols = index.answers("head", torch.tensor([2]), torch.tensor([0]))
    assert sorted(cols.tolist()) == [0, 1]


@pytest.mark.parametrize("huge", [False, True], ids=["packed", "rows"])
def test_filter_index_is_the_row_wise_index_and_answers_as_brute_force(huge: bool) -> None:
    """Packed into one key per triple (or, where ``(h * R + r) * E + t`` would overflow, the
    rows themselves): the index is the one a row-wise ``unique`` builds, duplicates within and
    across the sets are one fact, and every query's answers are those of a Python set."""
    gen = torch.Generator().manual_seed(0)
    ne, nr = (3_000_000_000, 2_000_000) if huge else (60, 4)
    ids = torch.randint(0, 50, (3, 300), generator=gen)
    ents = (ids * (ne // 50)).long() if huge else ids
    rels = torch.randint(0, nr, (300,), generator=gen) if not huge else ids[1] * (nr // 50)
    all_rows = torch.stack((ents[0], rels, ents[2]), 1)
    parts = [all_rows[:200], all_rows[150:], all_rows[:10]]  # overlapping sets
    index = FilterIndex.from_triples(parts, nr)
    known = torch.unique(torch.cat(parts), dim=0)  # the index as rows would build it
    h, r, t = known.unbind(1)
    to, ho = torch.argsort(h * nr + r, stable=True), torch.argsort(t * nr + r, stable=True)
    assert torch.equal(index.tail_keys, (h * nr + r)[to]) and torch.equal(index.tails, t[to])
    assert torch.equal(index.head_keys, (t * nr + r)[ho]) and torch.equal(index.heads, h[ho])
    facts = {tuple(x) for x in torch.cat(parts).tolist()}
    for side in ("tail", "head"):
        anchors = all_rows[:, 0] if side == "tail" else all_rows[:, 2]
        rows, found = index.answers(side, anchors, all_rows[:, 1])
        got = sorted(zip(rows.tolist(), found.tolist(), strict=True))
        want = sorted(
            (q, e)
            for q, (a, rel) in enumerate(zip(anchors.tolist(), all_rows[:, 1].tolist(), strict=True))
            for e in {x[2] if side == "tail" else x[0] for x in facts
                      if x[1] == rel and (x[0] if side == "tail" else x[2]) == a}
        )  # fmt: skip
        assert got == want, side


@pytest.mark.parametrize(
    ("ids", "relations", "packed"),
    [
        (3_037_000_498, 1, True),  # span**2 * R just under 2**63
        (3_037_000_499, 1, False),  # just over: rows
        (5, 3, False),  # a relation id the key cannot hold
    ],
)
def test_filter_index_packs_only_what_one_key_holds(
    ids: int, relations: int, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    unique = torch.unique

    def spy(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append("dim" in kwargs)
        return unique(x, *args, **kwargs)

    monkeypatch.setattr(torch, "unique", spy)
    triples = torch.tensor([[0, 0, ids], [ids, 0, 0], [0, 0, ids]])
    if relations == 3:
        triples = torch.tensor([[0, 3, 1], [1, 0, 2]])  # r = 3 with num_relations 3
    index = FilterIndex.from_triples([triples], relations)
    assert calls == [not packed]
    if relations == 1:
        _, found = index.answers("tail", triples[:1, 0], triples[:1, 1])
        assert found.tolist() == [ids]
        _, found = index.answers("head", triples[:1, 2], triples[:1, 1])
        assert found.tolist() == [0]


# -- split over the ranks of a gang ----------------------------------------------------------------

SPLIT_CASES = [
    *({"name": n, "reciprocal": rec, "ties": True} for n in sorted(INTERACTIONS) for rec in (0, 1)),
    {"fb15k237": "complex"},
    {"fb15k237": "transe"},
]


def _split_case(case: dict, root: str, part: tuple[int, int]) -> dict:
    if "fb15k237" not in case:
        model, test, known = _case(case["name"], bool(case["reciprocal"]), case["ties"])
        index = FilterIndex.from_triples(known, model.spec.num_relations)
        return evaluate(model, test, index, batch_size=7, part=part)
    from kgpipe.config.sections import DataConfig
    from kgpipe.data.dataset import load_dataset

    data = load_dataset(DataConfig(dataset="fb15k-237", root=root))
    model = KGEModel.build(
        ModelConfig(name=case["fb15k237"], dim=32, reciprocal=True),
        num_entities=data.num_entities,
        num_relations=data.num_relations,
        seed=3,
    )
    index = FilterIndex.from_triples([data.train, data.valid, data.test], data.num_relations)
    return evaluate(model, data.valid, index, batch_size=512, part=part)


def _split_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    import json

    import torch.distributed as dist

    import kgpipe.evaluation as ev

    torch.set_num_threads(1)
    real, seen = ev.split_block_ranks, [0, 0]  # blocks counted, the widest (its candidates)

    def counted(block: torch.Tensor, *args: Any) -> torch.Tensor:
        seen[0], seen[1] = seen[0] + 1, max(seen[1], int(block.shape[1]))
        return real(block, *args)

    ev.split_block_ranks = counted
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        results = [_split_case(case, root, (rank, world)) for case in SPLIT_CASES]
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_evaluation_split_over_ranks_equals_one_process_exactly(
    world: int, tmp_path: Path, datasets_root: Path
) -> None:
    """Each rank scores its range of entities and the counts are summed: the metrics equal the
    single-process evaluator's to the last bit -- small graphs full of exact ties (every
    interaction, both directions) and FB15k-237's 17,535 validation triples against its 14,541
    entities (ComplEx and TransE, random models) -- with 2 and 3 (uneven ranges) gloo ranks."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "split.json"
    mp.spawn(_split_rank, args=(world, port, str(datasets_root), str(out)), nprocs=world)
    split = json.loads(out.read_text())
    for rank in range(world):  # each rank scored its range, not every entity itself
        calls, widest = json.loads(Path(f"{out}.{rank}").read_text())
        assert calls > 0 and 0 < widest <= -(-14_541 // world), (rank, calls, widest)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: a reduction's order depends on the thread count
    try:
        one = [_split_case(c, str(datasets_root), (0, 1)) for c in SPLIT_CASES]
    finally:
        torch.set_num_threads(threads)
    one = json.loads(json.dumps(one))
    for case, a, b in zip(SPLIT_CASES, split, one, strict=True):
        assert a == b, case
    assert all(math.isfinite(r["mrr"]) for r in one)


# -- over a sharded table ------------------------------------------------------------------------


class _Tables:
    def __init__(self, model: KGEModel) -> None:
        self.tables = {"entity": model.entity, "relation": model.relation}
        self.optimizer: Any = None


def _sharded_case(
    case: dict, root: str, rank: int, world: int
) -> tuple[list[dict], list[dict] | None, list[int]]:
    """``evaluate_sharded`` of a case on this rank (its rows of the whole model), one process's
    ``evaluate`` of the whole model (rank 0), each against every entity and against a sample of
    9, how many chunks were counted in blocks and how many fell back from that to the whole
    matrix, and the widest product of the sampled ranking."""
    import kgpipe.distributed.sharded_eval as sharded_eval
    from kgpipe.distributed.comm import Comm
    from kgpipe.distributed.sharded import ShardedExchange, ShardMap

    if "fb15k237" in case:
        from kgpipe.config.sections import DataConfig
        from kgpipe.data.dataset import load_dataset

        data = load_dataset(DataConfig(dataset="fb15k-237", root=root))
        config = ModelConfig(name=case["fb15k237"], dim=32, reciprocal=True)
        model = KGEModel.build(
            config, num_entities=data.num_entities, num_relations=data.num_relations, seed=3
        )
        test, known = data.valid[:3000], [data.train, data.valid, data.test]
    else:
        model, test, known = _case(case["name"], bool(case["reciprocal"]), case["ties"])
    index = FilterIndex.from_triples(known, model.spec.num_relations)
    shards = ShardMap.build(model.spec.num_entities, shards=5, world_size=world, seed=1)
    exchange = ShardedExchange(Comm(world), shards, rank)
    local = KGEModel.build(
        ModelConfig(name=model.spec.name, dim=model.spec.dim, reciprocal=model.spec.reciprocal),
        num_entities=model.spec.num_entities,
        num_relations=model.spec.num_relations,
        seed=0,
        rows=exchange.own,
    )
    with torch.no_grad():
        local.entity.copy_(model.entity[exchange.own])
        local.relation.copy_(model.relation)
    exchange.bind(_Tables(local))
    fallbacks = [0, 0]  # chunks counted in blocks, chunks that fell back
    blocked = sharded_eval._blocked_ranks

    def counted(*args: Any) -> Any:
        got = blocked(*args)
        fallbacks[got is None] += 1
        return got

    widths = [0]  # the widest product of the sampled ranking
    scores = sharded_eval._scores

    def scored(*args: Any) -> Any:
        got = scores(*args)
        widths[0] = max(widths[0], int(got.shape[1]))
        return got

    sharded_eval._blocked_ranks = counted
    try:
        got = [sharded_eval.evaluate_sharded(local, exchange, test, index, batch_size=64)]
        sharded_eval._scores = scored  # the rows in the sample and the targets, not all
        got.append(
            sharded_eval.evaluate_sharded(local, exchange, test, index, batch_size=64, sampled=9)
        )
    finally:
        sharded_eval._blocked_ranks, sharded_eval._scores = blocked, scores
    one = None
    if rank == 0:
        one = [evaluate(model, test, index, batch_size=64, sampled=s) for s in (None, 9)]
    return got, one, [*fallbacks, widths[0]]


def _sharded_rank(rank: int, world: int, port: int, root: str, out: str, block: int) -> None:
    import json

    import torch.distributed as dist

    import kgpipe.distributed.sharded_eval as sharded_eval

    torch.set_num_threads(1)
    sharded_eval.BLOCK = block  # many blocks of each rank's rows
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        # FB15k-237 with realistic blocks only: TransE's distances of 5-row blocks round
        # unlike one process's 8,192-row blocks (the blocks' target check cannot see that)
        results = [
            _sharded_case(case, root, rank, world)
            if block >= 1000 or "fb15k237" not in case
            else None
            for case in SPLIT_CASES
        ]
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)


@pytest.mark.slow
def test_evaluation_over_a_sharded_table_equals_one_process_exactly(
    tmp_path: Path, datasets_root: Path
) -> None:
    """Each of 2 ranks holds the rows of its entity shards and counts a block of them at a time
    (5 or 1,000 rows a block on the small graphs full of ties, 1,000 on 3,000 FB15k-237
    validation triples): the metrics equal the single-process evaluator's to the last bit, and
    no chunk left the blocked count; so do those against a sample of 9 entities."""
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for block in (5, 1000):
        out = tmp_path / f"sharded-{block}.json"
        mp.spawn(_sharded_rank, args=(2, port, str(datasets_root), str(out), block), nprocs=2)
        for case, got in zip(SPLIT_CASES, json.loads(out.read_text()), strict=True):
            if got is None:
                continue
            sharded, one, (counted, fallbacks, widest) = got
            assert sharded == one, (block, case)
            assert 0 < widest <= 9 + 64, widest  # FB15k-237: not a rank's ~7,000 rows
            assert counted > 0 and fallbacks == 0, (block, case, counted, fallbacks)
            assert all(math.isfinite(m["mrr"]) for m in one)
            assert [m["candidates"] for m in one] == ["all", "sampled-9"]


@pytest.mark.parametrize("block", [None, 5])
def test_a_diverged_model_ranks_last_not_first(
    block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every comparison with NaN is false, so a model whose tables had gone to NaN ranked
    every answer first (MRR 1.0, and the "best" checkpoint of a diverged run). A NaN candidate
    now counts as better than the answer, and a NaN answer below every column."""
    import kgpipe.evaluation as ev
    from kgpipe.query_candidates import count_better, count_ranks

    if block is not None:
        monkeypatch.setattr(ev, "BLOCK", block)
    model, test, known = _case("distmult", False, False)
    index = FilterIndex.from_triples(known, model.spec.num_relations)
    ne = model.spec.num_entities
    with torch.no_grad():
        model.entity[3] = float("nan")  # one entity: a candidate better than every answer
    ref = _brute_force(model, test, known)  # NaN > x is false: the old count
    got = evaluate(model, test, index)
    assert got["mrr"] < ref["mrr"] and got["mr"] > ref["mr"]
    with torch.no_grad():
        model.entity.fill_(float("nan"))
    for result in (evaluate(model, test, index), evaluate(model, test, index, sampled=5)):
        assert result["mrr"] < 2.0 / 5, result
    # a NaN answer ranks last among the candidates that are not filtered out: not past them
    h, r, t = test.T
    rows, cols = index.answers("tail", h, r)
    known = torch.zeros(len(test), ne, dtype=torch.bool)
    known[rows, cols] = True
    known[torch.arange(len(test)), t] = False
    last = 1.0 + (ne - 1) - known.sum(1).double()  # every other entity not filtered
    got = evaluate(model, test, index)
    assert got["tail"]["mr"] == pytest.approx(float(last.mean()))
    nan, inf = float("nan"), float("inf")
    better, equal = count_ranks(torch.tensor([[nan, 1.0, 2.0], [1.0, nan, 0.5]]),
                                torch.tensor([[False, True], [False, False]]))  # fmt: skip
    assert better.tolist() == [1, 1] and equal.tolist() == [0, 0]
    assert count_better(torch.tensor([[1.0, -inf, nan]]), torch.tensor([[nan]])).tolist() == [2]


@pytest.mark.parametrize("block", [None, 5])
def test_an_answer_scoring_minus_infinity_ties_only_with_candidates(
    block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filtered columns (and the target's own) are masked with -inf, so an answer that itself
    scored -inf (a diverging model) counted every masked column as a tie. On a score matrix
    with answers and candidates at -inf (and a NaN), the ranks of the whole matrix and of
    blocks of 5 columns equal a count over the unfiltered candidates."""
    import kgpipe.evaluation as ev
    from kgpipe.query_candidates import count_ranks

    model, _, _ = _case("distmult", False, False)
    ne, nr = model.spec.num_entities, model.spec.num_relations
    inf, nan = float("inf"), float("nan")
    g = torch.Generator().manual_seed(3)
    known = _random_triples(60, ne, nr, 1)
    chunk = known[:8].clone()
    scores = torch.randint(0, 4, (8, ne), generator=g).float()
    scores[torch.rand(8, ne, generator=g) < 0.3] = -inf
    rows = torch.arange(8)
    scores[rows[:5], chunk[:5, 2]] = -inf  # five answers at -inf
    scores[6, 0] = nan
    scores[7, chunk[7, 2]] = nan  # a NaN answer: below every candidate, -inf ones included
    index = FilterIndex.from_triples([known], nr)
    f_rows, f_cols = index.answers("tail", chunk[:, 0], chunk[:, 1])
    expected = []
    for i in range(8):
        t = int(chunk[i, 2])
        out = {int(c) for r, c in zip(f_rows.tolist(), f_cols.tolist(), strict=True) if r == i}
        others = [float(scores[i, j]) for j in range(ne) if j != t and j not in out]
        true = float(scores[i, t])
        better = sum(x > true or math.isnan(x) or math.isnan(true) for x in others)
        expected.append(1 + better + sum(x == true for x in others) / 2)
    if block is None:
        got = realistic_ranks(scores.clone(), chunk[:, 2], f_rows, f_cols)
        # the NaN answer's rank does not depend on a -inf answer in its batch
        late = f_rows >= 5
        alone = realistic_ranks(scores[5:].clone(), chunk[5:, 2], f_rows[late] - 5, f_cols[late])
        assert alone.tolist() == expected[5:]
    else:
        monkeypatch.setattr(ev, "BLOCK", block)
        monkeypatch.setattr(ev, "_scores", lambda m, side, c, cand: scores[:, cand].clone())
        got = ev._blocked_ranks(model, "tail", chunk, index)
        assert got is not None
    assert got.tolist() == expected
    better, equal = count_ranks(torch.tensor([[-inf, -inf, 2.0, -inf]]),
                                torch.tensor([[True, False, False]]))  # fmt: skip
    assert better.tolist() == [1] and equal.tolist() == [1]
