"""Interactions: 1-vs-many scoring agrees with per-triple scoring; gradients match finite differences."""

from __future__ import annotations

import shutil

import pytest
import torch

from kgpipe.config import ModelConfig
from kgpipe.models.interactions import (
    INTERACTIONS,
    ComplEx,
    DistMult,
    Interaction,
    RotatE,
    TransE,
)
from kgpipe.models.model import KGEModel

CASES: dict[str, list[Interaction]] = {
    "transe": [TransE(p=1, margin=2.0), TransE(p=2, margin=0.0)],
    "distmult": [DistMult()],
    "complex": [ComplEx()],
    "rotate": [RotatE(margin=3.0)],
}
ALL = [i for cases in CASES.values() for i in cases]


def test_every_registered_interaction_is_tested() -> None:
    assert set(CASES) == set(INTERACTIONS)


def _emb(inter: Interaction, *shape: int, dim: int = 6, rel: bool = False) -> torch.Tensor:
    d = inter.relation_dim(dim) if rel else dim
    return torch.randn(*shape, d, dtype=torch.float64)


@pytest.mark.parametrize("inter", ALL, ids=lambda i: f"{i.name}-{getattr(i, 'p', '')}")
def test_score_tails_and_heads_match_score(inter: Interaction) -> None:
    torch.manual_seed(0)
    g, b, n = 3, 4, 5
    h, t = _emb(inter, g, b), _emb(inter, g, b)
    r = _emb(inter, g, b, rel=True)
    cand = _emb(inter, g, n)
    tails = inter.score_tails(h, r, cand)
    heads = inter.score_heads(r, t, cand)
    assert tails.shape == heads.shape == (g, b, n)
    for j in range(n):
        c = cand[:, j : j + 1].expand(g, b, -1)
        torch.testing.assert_close(tails[..., j], inter.score(h, r, c))
        torch.testing.assert_close(heads[..., j], inter.score(c, r, t))
    # 2-D (1-vs-all) form
    torch.testing.assert_close(inter.score_tails(h[0], r[0], cand[0]), tails[0])


@pytest.mark.parametrize("inter", ALL, ids=lambda i: f"{i.name}-{getattr(i, 'p', '')}")
def test_gradients_match_finite_differences(inter: Interaction) -> None:
    torch.manual_seed(1)
    b, n = 2, 3
    h = _emb(inter, b, dim=4).requires_grad_()
    r = _emb(inter, b, dim=4, rel=True).requires_grad_()
    t = _emb(inter, b, dim=4).requires_grad_()
    cand = _emb(inter, n, dim=4).requires_grad_()
    assert torch.autograd.gradcheck(inter.score, (h, r, t))
    assert torch.autograd.gradcheck(inter.score_tails, (h, r, cand))
    assert torch.autograd.gradcheck(inter.score_heads, (r, t, cand))


def test_hand_computed_scores() -> None:
    h = torch.tensor([1.0, 2.0])
    r = torch.tensor([0.5, -1.0])
    t = torch.tensor([2.0, 0.0])
    assert DistMult().score(h, r, t).item() == pytest.approx(1.0)
    assert TransE(p=1).score(h, r, t).item() == pytest.approx(-1.5)
    assert TransE(p=2).score(h, r, t).item() == pytest.approx(-((0.25 + 1.0) ** 0.5))
    # ComplEx with one component: h = 1+2i, r = 0.5-1i, t = 2+0i: Re(h r conj t) = Re((2.5 + 0i) * 2)
    assert ComplEx().score(h, r, t).item() == pytest.approx(5.0)
    # RotatE: h = 1+2i rotated by pi/2 -> -2+1i; t = 2 + 0i; |(-4) + 1i| = sqrt(17)
    phase = torch.tensor([torch.pi / 2])
    assert RotatE().score(h, phase, t).item() == pytest.approx(-(17**0.5), rel=1e-5)


@pytest.mark.parametrize("name", sorted(INTERACTIONS))
@pytest.mark.parametrize("reciprocal", [False, True])
def test_model_all_entity_scoring(name: str, reciprocal: bool) -> None:
    model = KGEModel.build(
        ModelConfig(name=name, dim=8, reciprocal=reciprocal, init="uniform", init_scale=1.0),
        num_entities=7,
        num_relations=3,
        seed=0,
    )
    h, r, t = torch.tensor([0, 5]), torch.tensor([2, 1]), torch.tensor([3, 3])
    tails = model.score_all_tails(h, r)
    heads = model.score_all_heads(r, t)
    assert tails.shape == heads.shape == (2, 7)
    for e in range(7):
        col = torch.full((2,), e)
        torch.testing.assert_close(tails[:, e], model.score_triples(torch.stack((h, r, col), 1)))
        if reciprocal:
            inv = torch.stack((t, model.inverse(r), col), 1)
            torch.testing.assert_close(heads[:, e], model.score_triples(inv))
        else:
            torch.testing.assert_close(
                heads[:, e], model.score_triples(torch.stack((col, r, t), 1))
            )


def test_build_is_deterministic_per_seed() -> None:
    cfg = ModelConfig(name="rotate", dim=8)
    a = KGEModel.build(cfg, num_entities=5, num_relations=2, seed=3)
    b = KGEModel.build(cfg, num_entities=5, num_relations=2, seed=3)
    c = KGEModel.build(cfg, num_entities=5, num_relations=2, seed=4)
    assert torch.equal(a.entity, b.entity) and torch.equal(a.relation, b.relation)
    assert not torch.equal(a.entity, c.entity)
    assert a.relation.shape == (2, 4)  # RotatE relations: dim/2 phases
    assert float(a.relation.abs().max()) <= torch.pi


@pytest.mark.parametrize("compiled", [False, True], ids=["sliced", "compiled"])
@pytest.mark.parametrize("shared", [True, False], ids=["chunks", "all-entities"])
def test_rotate_sliced_candidates_match_the_materialised_form(
    shared: bool, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RotatE scores candidates either in cache-sized slices with a hand-written backward pass
    or with a torch.compile'd kernel; both give the values and gradients of autograd through
    the plain, fully materialised expression (sliced: across many slices, g * b * k elements per
    candidate against a 2**19-element slice)."""
    from kgpipe.models import interactions

    if compiled and shutil.which("g++") is None:  # Inductor's CPU backend compiles C++
        pytest.skip("no C++ compiler: RotatE falls back to the eager kernel here")
    torch.manual_seed(0)
    inter = RotatE(margin=2.0, compiled=compiled)
    used: list[bool] = []
    fused = interactions._fused_modulus_sum

    def spy(*args: torch.Tensor) -> torch.Tensor | None:
        out = fused(*args)
        used.append(out is not None)
        return out

    monkeypatch.setattr(interactions, "_fused_modulus_sum", spy)
    monkeypatch.setattr(interactions, "COMPILE_MIN_ELEMENTS", 1 << 20)
    g, b, n, k = (3, 64, 700, 24) if shared else (1, 300, 5000, 16)
    h = torch.randn(g, b, 2 * k, dtype=torch.float64, requires_grad=True)
    r = torch.randn(g, b, k, dtype=torch.float64, requires_grad=True)
    shape = (g, n, 2 * k) if shared else (n, 2 * k)
    cand = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(g, b, n, dtype=torch.float64)

    def reference(h: torch.Tensor, r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        hr, hi = h[..., :k], h[..., k:]
        qr, qi = hr * r.cos() - hi * r.sin(), hr * r.sin() + hi * r.cos()
        dr = qr.unsqueeze(-2) - c[..., :k].unsqueeze(-3)
        di = qi.unsqueeze(-2) - c[..., k:].unsqueeze(-3)
        return 2.0 - torch.sqrt(dr * dr + di * di + 1e-12).sum(-1)

    fast = inter.score_tails(h, r, cand)
    grads = torch.autograd.grad((fast * weights).sum(), (h, r, cand))
    slow = reference(h, r, cand)
    expected = torch.autograd.grad((slow * weights).sum(), (h, r, cand))
    torch.testing.assert_close(fast, slow)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)
    with torch.no_grad():  # evaluation takes the same path
        torch.testing.assert_close(inter.score_tails(h, r, cand), slow)
    assert used == ([True] * 2 if compiled else [])


def test_rotate_scores_few_queries_without_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `predict` of one query against every entity took 21 s to compile (cold cache) where
    the eager kernel takes 0.4 s: calls of fewer than 64 queries stay eager, however many
    candidates they score; 64 queries of the same size compile."""
    from kgpipe.models import interactions

    calls: list[int] = []

    def spy(qr: torch.Tensor, *args: torch.Tensor) -> None:
        calls.append(qr.shape[-2])
        return None  # then the eager kernel, as where compiling is unavailable

    monkeypatch.setattr(interactions, "_fused_modulus_sum", spy)
    monkeypatch.setattr(interactions, "COMPILE_MIN_ELEMENTS", 1 << 16)
    inter = RotatE(margin=2.0, compiled=True)
    cand = torch.randn(20_000, 16)
    with torch.no_grad():
        one = inter.score_tails(torch.randn(1, 16), torch.randn(1, 8), cand)  # 160,000 elements
        many = inter.score_tails(torch.randn(64, 16), torch.randn(64, 8), cand)
    assert calls == [64]
    assert one.shape == (1, 20_000) and many.shape == (64, 20_000)


def test_rotate_falls_back_to_the_sliced_kernel_when_compiling_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No C++ compiler (or any other torch.compile failure): one warning, then the eager
    kernel, with the same scores."""
    from kgpipe.models import interactions

    def broken(*args: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no working C++ compiler")

    monkeypatch.setattr(interactions, "_compiled", broken)
    monkeypatch.setattr(interactions, "_compile_failed", False)
    monkeypatch.setattr(interactions, "COMPILE_MIN_ELEMENTS", 0)
    monkeypatch.setattr(interactions, "COMPILE_MIN_QUERIES", 0)
    h, r, cand = torch.randn(4, 8), torch.randn(4, 4), torch.randn(6, 8)
    with caplog.at_level("WARNING", logger="kgpipe.models"):
        got = RotatE(compiled=True).score_tails(h, r, cand)
        again = RotatE(compiled=True).score_tails(h, r, cand)
    torch.testing.assert_close(got, RotatE(compiled=False).score_tails(h, r, cand))
    torch.testing.assert_close(again, got)
    assert interactions._compile_failed
    assert [rec.message for rec in caplog.records if "torch.compile" in rec.message] == [
        "torch.compile of RotatE's distances failed; using the eager kernel: "
        "no working C++ compiler"
    ]


def test_transe_distances_of_near_candidates_are_exact_in_float32() -> None:
    """``|q|² + |c|² - 2 q·c`` cancels for candidates near the query: with rows of norm ~8
    the 20 candidates at distances 0.0005 i came out with 10 distinct distances, the nearest
    ranked 5th. Where no gradient is taken (ranking, predict) near pairs are computed
    directly: the order is the true one, the distances as ``score`` gives them; 1-vs-all and
    grouped (3-D) alike. A training step keeps the product (and its gradient)."""
    torch.manual_seed(0)
    inter = TransE(p=2)
    h, r = torch.randn(2, 200) * 0.6, torch.randn(2, 200) * 0.1
    q = h + r
    step = torch.randn(2, 200)
    step = step / step.norm(dim=-1, keepdim=True)
    near = [q[i] + step[i] * 0.0005 * k for i in range(2) for k in range(1, 21)]
    cand = torch.cat((torch.stack(near), torch.randn(30, 200) * 0.6))  # and far ones
    scores = inter.score_tails(h, r, cand)
    for i in range(2):
        ranked = scores[i].argsort(descending=True)[:20].tolist()
        assert ranked == list(range(20 * i, 20 * i + 20)), ranked
        want = inter.score(h[i].expand(len(cand), -1), r[i].expand(len(cand), -1), cand)
        torch.testing.assert_close(scores[i], want, rtol=1e-4, atol=1e-6)
    grouped = inter.score_tails(h.unsqueeze(0), r.unsqueeze(0), cand.unsqueeze(0))
    torch.testing.assert_close(grouped[0], scores)
    # with a gradient: the product as it was (a training step), its gradient sound (far
    # candidates: finite differences of the product's near distances are noise, even in float64)
    h64, r64 = h[:1].double().requires_grad_(), r[:1].double().requires_grad_()
    c64 = cand[40:45].double().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c: inter.score_tails(a, b, c), (h64, r64, c64))
