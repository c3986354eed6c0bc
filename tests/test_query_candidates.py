"""The OGB-style protocol: each query ranked against its own fixed candidates, checked against a
brute-force loop over the same candidates, with filtering and ties."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_evaluation import _case, _random_triples

import kgpipe.query_candidates as qcm
from kgpipe.config import ModelConfig, parse_config
from kgpipe.config.hash import config_hash
from kgpipe.errors import ConfigError
from kgpipe.evaluation import FilterIndex, evaluate
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.models.model import KGEModel
from kgpipe.query_candidates import GROUP, QueryCandidates


def _brute_force(
    model: KGEModel, test: torch.Tensor, known: list[torch.Tensor], qc: QueryCandidates
) -> dict[str, list[float]]:
    """Per-query Python loops over the drawn candidates, each triple scored on its own."""
    true = {tuple(x) for k in known for x in k.tolist()}
    ne, nr = model.spec.num_entities, model.spec.num_relations
    ranks: dict[str, list[float]] = {"head": [], "tail": []}
    for side in ("tail", "head"):
        targets = test[:, 2] if side == "tail" else test[:, 0]
        drawn = qc.draw(ne, side, targets, 0)
        for (h, r, t), cands in zip(test.tolist(), drawn.tolist(), strict=True):

            def score(e: int, h: int = h, r: int = r, t: int = t, side: str = side) -> float:
                if side == "tail":
                    q = [h, r, e]
                elif model.spec.reciprocal:
                    q = [t, r + nr, e]
                else:
                    q = [e, r, t]
                return float(model.score_triples(torch.tensor([q]))[0])

            answer = t if side == "tail" else h
            s_true = score(answer)
            kept = [
                score(e) for e in cands if ((h, r, e) if side == "tail" else (e, r, t)) not in true
            ]
            better = sum(s > s_true for s in kept)
            equal = sum(s == s_true for s in kept)
            ranks[side].append(1 + better + equal / 2)
    return ranks


@pytest.mark.parametrize("name", sorted(INTERACTIONS))
@pytest.mark.parametrize("reciprocal", [False, True])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("pairs", [None, 7])
def test_per_query_ranks_match_brute_force(
    name: str, reciprocal: bool, ties: bool, pairs: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also with the pairs scored 7 at a time (groups that cut across queries)."""
    if pairs is not None:
        monkeypatch.setattr(qcm, "PAIRS", pairs)
    model, test, known = _case(name, reciprocal, ties)
    index = FilterIndex.from_triples(known, model.spec.num_relations)
    qc = QueryCandidates(k=9, seed=3, split="test")
    ref = _brute_force(model, test, known, qc)
    both = ref["head"] + ref["tail"]
    for bs in (1, 4, 1000):
        got = evaluate(model, test, index, batch_size=bs, candidates=qc)
        assert got["candidates"] == "per-query-9"
        assert got["mrr"] == pytest.approx(sum(1 / x for x in both) / len(both), abs=1e-12)
        assert got["mr"] == pytest.approx(sum(both) / len(both), abs=1e-12)
        for side in ("head", "tail"):
            want = sum(1 / x for x in ref[side]) / len(ref[side])
            assert got[side]["mrr"] == pytest.approx(want, abs=1e-12), side
            assert got[side]["hits@1"] == pytest.approx(
                sum(x <= 1 for x in ref[side]) / len(ref[side])
            )
    if ties:  # the case exercises ties (half ranks) and the filter (ranks below k + 1)
        assert any(x != int(x) for x in both)


def test_the_filter_removes_known_answers_among_the_candidates() -> None:
    """Every candidate of every query a known answer: each answer ranks first."""
    ne, nr = 3, 1
    model = KGEModel.build(
        ModelConfig(name="distmult", dim=4, init="uniform", init_scale=1.0),
        num_entities=ne,
        num_relations=nr,
        seed=0,
    )
    everything = torch.tensor([[h, 0, t] for h in range(ne) for t in range(ne)])
    index = FilterIndex.from_triples([everything], nr)
    got = evaluate(model, everything, index, candidates=QueryCandidates(k=50))
    assert got["mrr"] == 1.0 and got["mr"] == 1.0
    unfiltered = evaluate(
        model,
        everything,
        FilterIndex.from_triples([everything[:1]], nr),
        candidates=QueryCandidates(k=50),
    )
    assert unfiltered["mr"] > 1.5


def test_draws_are_fixed_per_triple_and_never_the_answer() -> None:
    qc = QueryCandidates(k=16, seed=5, split="valid")
    ne, n = 1000, 2 * GROUP + 37
    targets = torch.randint(0, ne, (n,), generator=torch.Generator().manual_seed(1))
    whole = qc.draw(ne, "tail", targets, 0)
    assert whole.shape == (n, 16)
    assert int(whole.min()) >= 0 and int(whole.max()) < ne
    assert not (whole == targets.unsqueeze(1)).any()
    # the same rows whatever the chunking (batch sizes cut the split anywhere)
    for size in (1, 7, GROUP - 1, GROUP, GROUP + 1, 1000):
        parts = [qc.draw(ne, "tail", targets[s : s + size], s) for s in range(0, n, size)]
        assert torch.equal(torch.cat(parts), whole), size
    # another side, split or seed draws other candidates
    for other in (
        QueryCandidates(k=16, seed=5, split="test"),
        QueryCandidates(k=16, seed=6, split="valid"),
    ):
        assert not torch.equal(other.draw(ne, "tail", targets, 0), whole)
    assert not torch.equal(qc.draw(ne, "head", targets, 0), whole)
    # uniform: the counts per id spread like a Poisson's (variance / mean ~ 1; a skewed draw
    # or a lost id would spread them far more)
    counts = torch.bincount(whole.flatten(), minlength=ne).double()
    assert 0.8 < float(counts.var() / counts.mean()) < 1.2


def test_more_candidates_rank_lower_and_all_entities_bound_them() -> None:
    ne, nr = 60, 3
    model = KGEModel.build(
        ModelConfig(name="complex", dim=8, init="uniform", init_scale=1.0),
        num_entities=ne,
        num_relations=nr,
        seed=1,
    )
    train = _random_triples(200, ne, nr, 2)
    test = _random_triples(40, ne, nr, 3)
    index = FilterIndex.from_triples([train, test], nr)
    few = evaluate(model, test, index, candidates=QueryCandidates(k=5))
    many = evaluate(model, test, index, candidates=QueryCandidates(k=500))
    full = evaluate(model, test, index)
    assert few["mr"] <= 6.0
    assert few["mrr"] > many["mrr"]
    # with ~8x as many draws as entities nearly every other entity is drawn, some more than
    # once (with replacement): the mean rank exceeds the full protocol's
    assert many["mr"] > full["mr"]


def test_config_refuses_both_samplings_and_runs_state_the_protocol(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exclude each other"):
        parse_config({"data": {"dataset": "umls"}, "evaluation": {"sampled": 10, "candidates": 10}})
    from kgpipe.pipeline import train

    config = parse_config(
        {
            "run": {"root": str(tmp_path), "name": "ogb"},
            "data": {"dataset": "umls"},
            "model": {"name": "distmult", "dim": 16},
            "training": {"epochs": 2, "batch_size": 512, "negatives": 8},
            "evaluation": {"every": 1, "candidates": 20, "candidates_seed": 4},
        }
    )
    train(config)
    run = tmp_path / "ogb"
    results = json.loads((run / "results.json").read_text())
    protocol = results["protocol"]
    assert protocol["candidates"] == "per-query-20"
    assert protocol["candidate_sets"]["per_query"] == 20
    assert protocol["candidate_sets"]["seed"] == 4
    assert protocol["candidate_sets"]["comparable_with_full_ranking"] is False
    assert results["mr"] <= 21.0
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["valid_candidates"] for m in metrics] == ["per-query-20"] * 2


def test_the_protocol_is_part_of_what_early_stopping_compares() -> None:
    """Under early stopping a resume may not switch protocols (per-query MRRs run far above
    full ranking's); without it, it may; a config without candidates hashes as before."""

    def cfg(**evaluation: object) -> object:
        return parse_config({"data": {"dataset": "umls"}, "evaluation": {"every": 1, **evaluation}})

    assert config_hash(cfg(candidates=50)) == config_hash(cfg())
    assert config_hash(cfg(patience=2, candidates=50)) != config_hash(cfg(patience=2))
    assert config_hash(cfg(patience=2, candidates=50)) != config_hash(
        cfg(patience=2, candidates=50, candidates_seed=1)
    )
    assert config_hash(cfg(patience=2, candidates=50)) == config_hash(
        cfg(patience=2, candidates=50)
    )


def test_sampling_is_part_of_what_early_stopping_compares(tmp_path: Path) -> None:
    """A resume could set or unset evaluation.sampled under early stopping: epochs scored by
    full ranking then stopped the run against a sampled "best" (0.85 against 0.63) and the
    older sampled model was exported. Refused now, naming the key; without patience, and for
    runs without sampling, nothing changes."""
    from kgpipe.errors import KgpipeError
    from kgpipe.pipeline import train

    def cfg(**evaluation: object) -> object:
        return parse_config({"data": {"dataset": "umls"}, "evaluation": {"every": 1, **evaluation}})

    assert config_hash(cfg(sampled=10)) == config_hash(cfg())
    assert config_hash(cfg(patience=2, sampled=10)) != config_hash(cfg(patience=2))
    assert config_hash(cfg(patience=2, sampled=10)) != config_hash(cfg(patience=2, sampled=5))
    # a retrain series recorded by an older kgpipe (the hash of c3ee4df) is the same recipe
    from kgpipe.config import config_hashes

    old = "bc668d8ead534ecf4fdbfb94465fc2a89efe3ec934952c3f6801c241610c32c6"
    assert old in config_hashes(cfg(patience=2, sampled=10)) and old != config_hash(
        cfg(patience=2, sampled=10)
    )
    base = {"run": {"root": str(tmp_path), "name": "s"}, "data": {"dataset": "umls"},
            "model": {"name": "distmult", "dim": 8}, "training": {"epochs": 1}}  # fmt: skip
    evaluation = {"every": 1, "patience": 2, "test": False}
    train(parse_config({**base, "evaluation": {**evaluation, "sampled": 10}}))
    longer = {**base, "training": {"epochs": 2}, "evaluation": evaluation}
    with pytest.raises(KgpipeError, match=r"evaluation.sampled: 10 in the run, None given\)"):
        train(parse_config(longer), resume=True)


def test_as_many_candidates_as_entities_are_refused_where_a_run_starts(tmp_path: Path) -> None:
    """Candidates are drawn with replacement from the entities other than the answer: on UMLS
    (135 entities) `evaluation.candidates: 2000` trained and reported a mean rank of 172. A
    run, and an evaluation of a run, now refuse as many as there are other entities."""
    from kgpipe.errors import RunError
    from kgpipe.pipeline import train
    from kgpipe.runs.read import evaluate_run

    data = {"run": {"root": str(tmp_path), "name": "many"}, "data": {"dataset": "umls"},
            "model": {"name": "distmult", "dim": 8}, "training": {"epochs": 1},
            "evaluation": {"candidates": 134}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"134 candidates a query are not fewer than the 134"):
        train(parse_config(data))
    assert not (tmp_path / "many").exists()
    data["evaluation"] = {"candidates": 133}
    result = train(parse_config(data))
    assert result.results is not None and result.results["mr"] <= 134
    with pytest.raises(RunError, match=r"1000 candidates a query are not fewer than the 134"):
        evaluate_run(str(tmp_path / "many"), candidates=1000)
    assert evaluate_run(str(tmp_path / "many"), candidates="all")["mr"] <= 135
