"""The training step against an independent dense computation; determinism; learning."""

from __future__ import annotations

import pytest
import torch

from kgpipe.config import DropoutConfig, ModelConfig, RegularizerConfig, TrainingConfig
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.models.model import KGEModel
from kgpipe.training.loop import Trainer, clip_grad_norm
from kgpipe.training.losses import negative_sampling_loss

NE, NR = 17, 3


def _triples(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack(
        (
            torch.randint(0, NE, (n,), generator=g),
            torch.randint(0, NR, (n,), generator=g),
            torch.randint(0, NE, (n,), generator=g),
        ),
        1,
    )


def _model(name: str, reciprocal: bool = False, dim: int = 6) -> KGEModel:
    return KGEModel.build(
        ModelConfig(name=name, dim=dim, reciprocal=reciprocal, init="uniform", init_scale=0.5),
        num_entities=NE,
        num_relations=NR,
        seed=0,
    )


def _assert_grads_equal(grads: dict, entity: torch.Tensor, relation: torch.Tensor) -> None:
    """Row gradients of a step equal dense reference gradients of the two tables."""
    for table, ref in (("entity", entity), ("relation", relation)):
        g = grads[table]
        dense = torch.zeros_like(ref)
        dense[g.rows] = g.values
        torch.testing.assert_close(dense, ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", sorted(INTERACTIONS))
@pytest.mark.parametrize("reciprocal", [False, True])
@pytest.mark.parametrize("loss", ["margin", "softplus", "bce", "nssa", "cross_entropy"])
def test_shared_negative_gradients_equal_per_triple_reference(
    name: str, reciprocal: bool, loss: str
) -> None:
    """Chunked, padded, gathered scoring gives the gradient of a plain per-triple loop."""
    model = _model(name, reciprocal)
    reg = RegularizerConfig(type="n3", weight=0.01)
    cfg = TrainingConfig(batch_size=11, negatives=4, chunk_size=3, loss=loss, margin=0.5)
    trainer = Trainer(model, _triples(11), training=cfg, regularizer=reg, seed=0)
    batch = _triples(11)
    negs = trainer.strategy.draw(11, torch.Generator().manual_seed(1))
    assert negs is not None and negs.shape == (
        4,
        4,
    )  # 6 tail + 5 head positives in chunks of 3: 2 + 2
    res = trainer.compute_gradients(batch, negs, global_queries=11, global_batch=11)

    # reference: dense tables, one positive at a time, negatives as explicit triples
    ent = model.entity.detach().clone().requires_grad_()
    rel = model.relation.detach().clone().requires_grad_()
    inter = model.interaction
    total = 0.0
    chunk_of = [i // 3 for i in range(6)] + [2 + i // 3 for i in range(5)]
    for i, (h, r, t) in enumerate(batch.tolist()):
        negatives = negs[chunk_of[i]]
        if i < 6:  # tail side
            pos = inter.score(ent[h], rel[r], ent[t])
            neg = torch.stack([inter.score(ent[h], rel[r], ent[e]) for e in negatives.tolist()])
        elif reciprocal:
            ri = r + NR
            pos = inter.score(ent[t], rel[ri], ent[h])
            neg = torch.stack([inter.score(ent[t], rel[ri], ent[e]) for e in negatives.tolist()])
        else:
            pos = inter.score(ent[h], rel[r], ent[t])
            neg = torch.stack([inter.score(ent[e], rel[r], ent[t]) for e in negatives.tolist()])
        per = negative_sampling_loss(
            loss, pos.view(1), neg.view(1, -1), margin=0.5, temperature=1.0
        )
        total = total + per.sum() / 11
        ri = r + NR if (reciprocal and i >= 6) else r
        total = total + trainer.regularizer(ent[h][None], rel[ri][None], ent[t][None]) / 11
    total.backward()

    _assert_grads_equal(res.grads, ent.grad, rel.grad)
    assert res.queries == 11


@pytest.mark.parametrize("name", ["distmult", "complex", "transe"])
@pytest.mark.parametrize("reciprocal", [False, True])
def test_dropout_gradients_equal_masked_reference(name: str, reciprocal: bool) -> None:
    """Negative sampling with dropout: the gradient of a per-triple loop that multiplies every
    use of a row by its mask, and the regulariser sees the rows before dropout."""
    model = _model(name, reciprocal)
    reg = RegularizerConfig(type="n3", weight=0.01)
    drop = DropoutConfig(entity=0.4, relation=0.3)
    cfg = TrainingConfig(batch_size=11, negatives=4, chunk_size=3, loss="cross_entropy")
    trainer = Trainer(model, _triples(11), training=cfg, regularizer=reg, seed=0, dropout=drop)
    trainer.global_step = 5
    batch = _triples(11)
    negs = trainer.strategy.draw(11, torch.Generator().manual_seed(1))
    assert negs is not None
    res = trainer.compute_gradients(batch, negs, global_queries=11, global_batch=11)
    assert trainer.dropout is not None
    widths = (model.entity.shape[1], model.relation.shape[1])
    mh, mt, mn, mr = trainer.dropout.chunk_masks(
        5, torch.arange(4), 3, 4, widths, model.entity.device
    )
    for m, p in ((mh, 0.4), (mn, 0.4), (mr, 0.3)):  # inverted dropout: 0 or 1/(1-p)
        values = m.unique()
        assert values.numel() == 2 and values[0] == 0.0
        assert float(values[1]) == pytest.approx(1 / (1 - p))

    ent = model.entity.detach().clone().requires_grad_()
    rel = model.relation.detach().clone().requires_grad_()
    inter = model.interaction
    total = 0.0
    for i, (h, r, t) in enumerate(batch.tolist()):
        k, j = (i // 3, i % 3) if i < 6 else (2 + (i - 6) // 3, (i - 6) % 3)
        he, te, re_ = ent[h] * mh[k, j], ent[t] * mt[k, j], None
        cand = ent[negs[k]] * mn[k]
        ri = r + NR if (reciprocal and i >= 6) else r
        re_ = rel[ri] * mr[k, j]
        if i < 6:
            pos, neg = inter.score(he, re_, te), inter.score_tails(he[None], re_[None], cand)[0]
        elif reciprocal:
            pos, neg = inter.score(te, re_, he), inter.score_tails(te[None], re_[None], cand)[0]
        else:
            pos, neg = inter.score(he, re_, te), inter.score_heads(re_[None], te[None], cand)[0]
        per = negative_sampling_loss(
            "cross_entropy", pos.view(1), neg.view(1, -1), margin=0.0, temperature=1.0
        )
        total = total + per.sum() / 11
        total = total + trainer.regularizer(ent[h][None], rel[ri][None], ent[t][None]) / 11
    total.backward()
    _assert_grads_equal(res.grads, ent.grad, rel.grad)


@pytest.mark.parametrize(
    "mode,loss", [("1vsall", "cross_entropy"), ("kvsall", "bce"), ("kvsall", "cross_entropy")]
)
def test_dropout_in_all_entity_modes_equals_masked_reference(mode: str, loss: str) -> None:
    """1-vs-all/KvsAll with dropout: one entity-table mask per step, used by queries and
    candidates alike; the gradient equals a dense computation with that mask."""
    model = _model("complex", reciprocal=True)
    cfg = TrainingConfig(mode=mode, loss=loss, batch_size=8)
    drop = DropoutConfig(entity=0.5, relation=0.25)
    train = _triples(8)
    trainer = Trainer(
        model, train, training=cfg, regularizer=RegularizerConfig(), seed=0, dropout=drop
    )
    if mode == "1vsall":
        batch, queries = _triples(8, 3), 16
    else:
        index = trainer.strategy.index  # type: ignore[attr-defined]
        batch, queries = torch.arange(len(index)), len(index)
    res = trainer.compute_gradients(batch, None, global_queries=queries, global_batch=8)
    ones_e = torch.ones_like(model.entity)
    ones_r = torch.ones_like(model.relation)
    assert trainer.dropout is not None
    me, mr = trainer.dropout.tables(
        0, ones_e, ones_r, torch.arange(ones_r.shape[0]), tuple(ones_r.shape)
    )
    assert 0.3 < float((me == 0).float().mean()) < 0.7

    ent = model.entity.detach().clone().requires_grad_()
    rel = model.relation.detach().clone().requires_grad_()
    e, r_ = ent * me, rel * mr
    inter = model.interaction
    if mode == "1vsall":
        h, r, t = batch.unbind(1)
        scores = torch.cat(
            (inter.score_tails(e[h], r_[r], e), inter.score_tails(e[t], r_[r + NR], e))
        )
        total = torch.nn.functional.cross_entropy(scores, torch.cat((t, h)), reduction="sum")
    else:
        idx = trainer.strategy.index  # type: ignore[attr-defined]
        a, rr, side = idx.anchor, idx.relation, idx.side
        labels = idx.labels(batch, NE)
        scores = torch.stack(
            [
                inter.score_tails(e[a[q]][None], r_[rr[q]][None], e)[0]
                if side[q] == 0
                else inter.score_heads(r_[rr[q]][None], e[a[q]][None], e)[0]
                for q in range(len(batch))
            ]
        )
        if loss == "bce":
            total = torch.nn.functional.binary_cross_entropy_with_logits(
                scores, labels, reduction="sum"
            )
        else:  # each query's answers share its target probability equally
            target = labels / labels.sum(-1, keepdim=True)
            total = -(target * torch.log_softmax(scores, -1)).sum()
    (total / queries).backward()
    g = res.grads["entity"]
    torch.testing.assert_close(g.values, ent.grad[g.rows], rtol=1e-4, atol=1e-6)
    g = res.grads["relation"]
    dense = torch.zeros_like(rel.grad)
    dense[g.rows] = g.values
    torch.testing.assert_close(dense, rel.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "name,reciprocal,precision",
    [
        ("complex", False, "fp32"),
        ("complex", True, "fp32"),  # the fused linear cross-entropy path
        ("distmult", True, "fp32"),
        ("transe", True, "fp32"),  # not bilinear: score matrix, then the loss
        ("complex", True, "bf16"),
        ("distmult", False, "bf16"),
    ],
)
def test_one_vs_all_gradient_equals_dense_reference(
    name: str, reciprocal: bool, precision: str
) -> None:
    """With the penalty a mean over the queries' triples: (h, r, t) for the tail query and
    (t, r⁻¹, h) for a reciprocal model's head query (the inverse rows went unpenalised)."""
    model = _model(name, reciprocal)
    cfg = TrainingConfig(mode="1vsall", loss="cross_entropy", batch_size=8, precision=precision)
    reg = RegularizerConfig(type="n3", weight=0.05)
    trainer = Trainer(model, _triples(8), training=cfg, regularizer=reg, seed=0)
    batch = _triples(8, 3)
    res = trainer.compute_gradients(batch, None, global_queries=16, global_batch=8)
    ent = model.entity.detach().clone().requires_grad_()
    rel = model.relation.detach().clone().requires_grad_()
    total = 0.0
    for h, r, t in batch.tolist():
        tails = torch.stack([model.interaction.score(ent[h], rel[r], ent[e]) for e in range(NE)])
        if reciprocal:
            heads = torch.stack(
                [model.interaction.score(ent[t], rel[r + NR], ent[e]) for e in range(NE)]
            )
        else:
            heads = torch.stack(
                [model.interaction.score(ent[e], rel[r], ent[t]) for e in range(NE)]
            )
        total = total - torch.log_softmax(tails, 0)[t] - torch.log_softmax(heads, 0)[h]
        head_query = (ent[t], rel[r + NR], ent[h]) if reciprocal else (ent[h], rel[r], ent[t])
        for hq, rq, tq in ((ent[h], rel[r], ent[t]), head_query):
            total = total + trainer.regularizer(hq[None], rq[None], tq[None])
    (total / 16).backward()
    # bfloat16 products: 8 mantissa bits, so compare at that precision (relative to the scale)
    tol = {"rtol": 1e-4, "atol": 1e-6} if precision == "fp32" else {"rtol": 0.0, "atol": 0.0}
    if precision == "bf16":
        tol["atol"] = 2e-2 * float(ent.grad.abs().max())
    torch.testing.assert_close(res.grads["entity"].values, ent.grad, **tol)
    dense = torch.zeros_like(rel.grad)
    dense[res.grads["relation"].rows] = res.grads["relation"].values
    if precision == "bf16":
        tol["atol"] = 2e-2 * float(rel.grad.abs().max())
    torch.testing.assert_close(dense, rel.grad, **tol)


def test_kvsall_labels_are_all_known_answers() -> None:
    train = torch.tensor([[0, 0, 1], [0, 0, 2], [3, 1, 2], [0, 0, 1]])
    model = _model("distmult")
    cfg = TrainingConfig(mode="kvsall", loss="bce", batch_size=4)
    trainer = Trainer(model, train, training=cfg, regularizer=RegularizerConfig(), seed=0)
    idx = trainer.strategy.index  # type: ignore[attr-defined]
    labels = idx.labels(torch.arange(len(idx)), NE)
    got = set()
    for q in range(len(idx)):
        a, r, s = int(idx.anchor[q]), int(idx.relation[q]), int(idx.side[q])
        got.add((a, r, s, tuple(labels[q].nonzero().squeeze(-1).tolist())))
    assert got == {
        (0, 0, 0, (1, 2)),
        (3, 1, 0, (2,)),
        (1, 0, 1, (0,)),
        (2, 0, 1, (0,)),
        (2, 1, 1, (3,)),
    }


@pytest.mark.parametrize("reciprocal", [False, True])
def test_kvsall_penalises_the_triples_its_queries_cover(reciprocal: bool) -> None:
    """KvsAll ignored model.regularizer (an N3 weight of 10 trained the same tables as 0). The
    penalty is a mean per covered triple: weight * Σ over each query's (anchor, relation,
    answer) rows / (queries in the global batch * answers per query), here against a brute
    force over the training triples."""
    train = _triples(40, 5)
    cfg = TrainingConfig(mode="kvsall", loss="bce", batch_size=64)
    weight = 0.3

    def step(w: float) -> tuple[Trainer, dict[str, torch.Tensor]]:
        reg = RegularizerConfig(type="n3", weight=w)
        model = _model("distmult", reciprocal)
        trainer = Trainer(model, train, training=cfg, regularizer=reg, seed=0)
        queries = torch.arange(len(trainer.strategy.index))  # type: ignore[attr-defined]
        res = trainer.compute_gradients(queries, None, global_queries=64, global_batch=64)
        dense = {}
        for name, g in res.grads.items():
            dense[name] = torch.zeros_like(trainer.tables[name])
            dense[name][g.rows] += g.values
        return trainer, dense

    trainer, plain = step(0.0)
    _, penalised = step(weight)
    ent = trainer.tables["entity"].detach().clone().requires_grad_(True)
    rel = trainer.tables["relation"].detach().clone().requires_grad_(True)
    triples = {tuple(t) for t in train.tolist()}
    covered = []  # (anchor, relation row, answer, side) from the distinct triples
    for h, r, t in sorted(triples):
        covered.append((h, r, t, 0))
        covered.append((t, r + NR, h, 0) if reciprocal else (t, r, h, 1))
    queries = len({(a, r, side) for a, r, _, side in covered})
    assert queries == len(trainer.strategy.index)  # type: ignore[attr-defined]
    total = sum(
        ent[a].abs().pow(3).sum() + rel[r].abs().pow(3).sum() + ent[x].abs().pow(3).sum()
        for a, r, x, _ in covered
    )
    (weight * total / (64 * len(covered) / queries)).backward()
    assert ent.grad is not None and rel.grad is not None
    torch.testing.assert_close(penalised["entity"] - plain["entity"], ent.grad)
    torch.testing.assert_close(penalised["relation"] - plain["relation"], rel.grad)


@pytest.mark.parametrize("reciprocal", [False, True])
def test_rotate_kvsall_trains_when_a_side_has_no_queries(reciprocal: bool) -> None:
    """With reciprocal relations every KvsAll query is a tail query, and a small last batch
    may hold one side only: RotatE's compiled path divided by the empty side's size."""
    model = _model("rotate", reciprocal)
    assert model.interaction.compiled  # type: ignore[attr-defined]
    cfg = TrainingConfig(mode="kvsall", loss="bce", batch_size=7, epochs=1)
    trainer = Trainer(model, _triples(40, 5), training=cfg, regularizer=RegularizerConfig(), seed=0)
    trainer.fit()
    assert torch.isfinite(trainer.tables["entity"]).all()


@pytest.mark.parametrize(
    "mode,loss",
    [
        ("negative_sampling", "softplus"),
        ("1vsall", "cross_entropy"),
        ("kvsall", "bce"),
        ("kvsall", "cross_entropy"),
    ],
)
def test_same_seed_gives_bit_identical_parameters(mode: str, loss: str) -> None:
    def run(seed: int) -> KGEModel:
        model = _model("complex", dim=8)
        cfg = TrainingConfig(
            mode=mode, loss=loss, epochs=2, batch_size=16, negatives=5, chunk_size=4
        )
        Trainer(model, _triples(50), training=cfg, regularizer=RegularizerConfig(), seed=seed).fit()
        return model

    a, b, c = run(1), run(1), run(2)
    assert torch.equal(a.entity, b.entity) and torch.equal(a.relation, b.relation)
    assert not torch.equal(a.entity, c.entity)


def test_only_touched_rows_change() -> None:
    model = _model("transe")
    before = model.entity.detach().clone()
    cfg = TrainingConfig(batch_size=2, negatives=1, chunk_size=1, epochs=1)
    train = torch.tensor([[0, 0, 1], [2, 1, 3]])
    trainer = Trainer(model, train, training=cfg, regularizer=RegularizerConfig(), seed=0)
    gen = trainer.generator(1)
    trainer.train_epoch()
    # replay the epoch's draws: permutation, then one negative per chunk
    torch.randperm(2, generator=gen)
    negs = torch.randint(0, NE, (2, 1), generator=gen)
    touched = set(train[:, [0, 2]].flatten().tolist()) | set(negs.flatten().tolist())
    changed = {i for i in range(NE) if not torch.equal(model.entity[i], before[i])}
    assert changed <= touched and changed


def test_training_reduces_loss_and_reaches_known_quality() -> None:
    """A planted graph (every relation a permutation) is learnt: loss falls, train MRR ~ 1."""
    from kgpipe.evaluation import FilterIndex, evaluate

    g = torch.Generator().manual_seed(0)
    heads = torch.arange(NE).repeat(NR)
    rels = torch.arange(NR).repeat_interleave(NE)
    perms = torch.stack([torch.randperm(NE, generator=g) for _ in range(NR)])
    train = torch.stack((heads, rels, perms[rels, heads]), 1)
    model = KGEModel.build(
        ModelConfig(name="complex", dim=32, init_scale=0.1),
        num_entities=NE,
        num_relations=NR,
        seed=0,
    )
    cfg = TrainingConfig(mode="1vsall", loss="cross_entropy", epochs=60, batch_size=16, lr=0.05)
    hist = Trainer(model, train, training=cfg, regularizer=RegularizerConfig(), seed=0).fit()
    assert hist[-1].loss < 0.5 * hist[0].loss
    m = evaluate(model, train, FilterIndex.from_triples([train], NR))
    assert m["mrr"] > 0.95


def test_regularizers_hand_computed() -> None:
    h = torch.tensor([[3.0, 4.0]])  # complex: one component 3+4i, |z| = 5
    r = torch.tensor([[1.0, -2.0]])
    t = torch.tensor([[0.0, 1.0]])
    cfg = TrainingConfig(batch_size=1)

    def reg(name: str, kind: str, p: float = 2.0) -> float:
        model = _model(name, dim=2)
        trainer = Trainer(
            model, _triples(2), training=cfg,
            regularizer=RegularizerConfig(type=kind, weight=0.5, p=p), seed=0,
        )  # fmt: skip
        rr = r[:, :1] if name == "rotate" else r
        return float(trainer.regularizer(h, rr, t))

    assert reg("distmult", "lp", 2.0) == pytest.approx(0.5 * (9 + 16 + 1 + 4 + 0 + 1))
    assert reg("distmult", "lp", 1.0) == pytest.approx(0.5 * (3 + 4 + 1 + 2 + 0 + 1))
    assert reg("distmult", "n3") == pytest.approx(0.5 * (27 + 64 + 1 + 8 + 0 + 1))
    # ComplEx N3 uses moduli: |h|^3 = 125, |r|^3 = 5^1.5, |t|^3 = 1
    assert reg("complex", "n3") == pytest.approx(0.5 * (125 + 5**1.5 + 1))
    # RotatE relations are phases: not regularised
    assert reg("rotate", "n3") == pytest.approx(0.5 * (125 + 1))
    assert reg("rotate", "lp") == pytest.approx(0.5 * (25 + 1))


def test_gradient_clipping_bounds_the_global_norm() -> None:
    model = _model("distmult")
    cfg = TrainingConfig(batch_size=8, negatives=4, chunk_size=4, clip_grad_norm=1e-3, lr=1.0)
    trainer = Trainer(model, _triples(8), training=cfg, regularizer=RegularizerConfig(), seed=0)
    batch = _triples(8, 5)
    res = trainer.compute_gradients(
        batch, trainer.strategy.draw(8, trainer.generator(1)), global_queries=8, global_batch=8
    )
    before = sum(float(g.values.pow(2).sum()) for g in res.grads.values()) ** 0.5
    assert before > 1e-3
    clip_grad_norm(res.grads, cfg.clip_grad_norm)
    after = sum(float(g.values.pow(2).sum()) for g in res.grads.values()) ** 0.5
    assert after == pytest.approx(1e-3, rel=1e-4)


def test_callbacks_see_every_event_in_order() -> None:
    from kgpipe.training.hooks import Callback

    events: list[tuple] = []

    class Recorder(Callback):
        def on_train_start(self, trainer: Trainer) -> None:
            events.append(("start",))

        def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
            events.append(("epoch_start", epoch))

        def on_batch_end(
            self, trainer: Trainer, epoch: int, step: int, steps: int, loss: float
        ) -> None:
            events.append(("batch", epoch, step, steps))

        def on_epoch_end(self, trainer: Trainer, stats) -> None:  # type: ignore[no-untyped-def]
            events.append(("epoch_end", stats.epoch))
            stats.extra["seen"] = True

        def on_train_end(self, trainer: Trainer) -> None:
            events.append(("end",))

    cfg = TrainingConfig(batch_size=4, negatives=2, chunk_size=2, epochs=2)
    trainer = Trainer(
        _model("transe"),
        _triples(6),
        training=cfg,
        regularizer=RegularizerConfig(),
        seed=0,
        callbacks=[Recorder()],
    )
    hist = trainer.fit()
    assert events == [
        ("start",),
        ("epoch_start", 1), ("batch", 1, 1, 2), ("batch", 1, 2, 2), ("epoch_end", 1),
        ("epoch_start", 2), ("batch", 2, 1, 2), ("batch", 2, 2, 2), ("epoch_end", 2),
        ("end",),
    ]  # fmt: skip
    assert hist[0].as_dict()["seen"] is True and trainer.global_step == 4


def test_warmup_reaches_the_optimizer() -> None:
    cfg = TrainingConfig(batch_size=2, negatives=2, chunk_size=1, epochs=1, warmup_steps=4, lr=0.4)
    trainer = Trainer(
        _model("distmult"), _triples(6), training=cfg, regularizer=RegularizerConfig(), seed=0
    )
    seen: list[float] = []
    step = trainer.optimizer.step

    def spy(grads, *, lr=None):  # type: ignore[no-untyped-def]
        seen.append(lr)
        step(grads, lr=lr)

    trainer.optimizer.step = spy  # type: ignore[method-assign]
    trainer.fit()
    assert seen == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize(
    "mode,loss",
    [
        ("negative_sampling", "softplus"),
        ("1vsall", "cross_entropy"),
        ("kvsall", "bce"),
        ("kvsall", "cross_entropy"),
    ],
)
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("dropout", [None, DropoutConfig(entity=0.3, relation=0.2)])
def test_parts_of_a_global_batch_sum_to_its_gradient(
    mode: str, loss: str, parts: int, dropout: DropoutConfig | None
) -> None:
    """What each rank of a step-synchronised gang computes adds up to the whole batch's gradient
    (with dropout too: a step's masks do not depend on how the ranks split it)."""
    cfg = TrainingConfig(mode=mode, loss=loss, batch_size=11, negatives=4, chunk_size=2)
    reg = RegularizerConfig(type="n3", weight=0.01)
    train = _triples(30)

    def grads(part: tuple[int, int]) -> tuple[dict[str, torch.Tensor], int]:
        model = _model("complex", dim=8)
        trainer = Trainer(
            model, train, training=cfg, regularizer=reg, seed=0, part=part, dropout=dropout
        )
        batch = torch.arange(11) if mode == "kvsall" else _triples(11, 4)
        negs = trainer.strategy.draw(11, torch.Generator().manual_seed(3))
        res = trainer.compute_gradients(
            batch, negs, global_queries=22 if mode == "1vsall" else 11, global_batch=11
        )
        dense = {}
        for name, g in res.grads.items():
            d = torch.zeros_like(trainer.tables[name])
            d[g.rows] += g.values
            dense[name] = d
        return dense, res.queries

    full, q_full = grads((0, 1))
    pieces = [grads((i, parts)) for i in range(parts)]
    assert sum(q for _, q in pieces) == q_full
    for name in full:
        torch.testing.assert_close(
            sum(p[name] for p, _ in pieces), full[name], rtol=1e-5, atol=1e-7
        )


@pytest.mark.parametrize("name", ["transe", "rotate"])
def test_bf16_is_refused_for_distance_models(name: str) -> None:
    from pydantic import ValidationError

    from kgpipe.config import RunConfig

    with pytest.raises(ValidationError, match="precision=bf16 works with the bilinear models"):
        RunConfig.model_validate(
            {"data": {"dataset": "umls"}, "model": {"name": name},
             "training": {"precision": "bf16"}}
        )  # fmt: skip


def test_dropout_enters_the_config_hash_only_when_active() -> None:
    from kgpipe.config import RunConfig, config_hash

    base = RunConfig.model_validate({"data": {"dataset": "umls"}})
    # the hash of this config before model.dropout existed (commit 9a834c8): runs from then resume
    assert config_hash(base) == "bc668d8ead534ecf4fdbfb94465fc2a89efe3ec934952c3f6801c241610c32c6"
    dropped = RunConfig.model_validate(
        {"data": {"dataset": "umls"}, "model": {"dropout": {"entity": 0.1}}}
    )
    assert config_hash(dropped) != config_hash(base)


def test_lossy_distribution_enters_the_config_hash_only_where_set() -> None:
    """Per-epoch model averaging, lossy compression and bounded staleness change what a gang
    trains: a resume may not switch them (it was accepted), and a retrain series sees them. The
    world size, the strategy and step sync without them do not (they equal one process)."""
    from kgpipe.config import RunConfig, config_hash, training_differences

    def cfg(**distributed: object) -> RunConfig:
        return RunConfig.model_validate({"data": {"dataset": "umls"}, "distributed": distributed})

    base = cfg()
    assert config_hash(base) == "bc668d8ead534ecf4fdbfb94465fc2a89efe3ec934952c3f6801c241610c32c6"
    assert config_hash(cfg(workers=4, strategy="sharded", entity_shards=4)) == config_hash(base)
    assert training_differences(base, cfg(workers=4, sync="epoch")) == [
        ("distributed.sync", None, "epoch")
    ]
    assert [k for k, _, _ in training_differences(base, cfg(compression="topk"))] == [
        "distributed.compression",
        "distributed.topk_ratio",
    ]
    assert config_hash(cfg(compression="int8")) != config_hash(base)
    sharded = cfg(workers=2, strategy="sharded", entity_shards=2)
    stale = cfg(workers=2, strategy="sharded", entity_shards=2, staleness=3)
    assert training_differences(sharded, stale) == [("distributed.staleness", None, 3)]
    # a retrain series recorded before these counted is the same recipe (it retrained once)
    from kgpipe.config import config_hashes

    assert config_hash(stale, lossy=False) == config_hash(sharded) in config_hashes(stale)


def test_plateau_settings_and_validations_enter_the_config_hash_only_under_plateau() -> None:
    from kgpipe.config import RunConfig, config_hash

    def cfg(training: dict, every: int = 5) -> RunConfig:
        return RunConfig.model_validate(
            {"data": {"dataset": "umls"}, "training": training, "evaluation": {"every": every}}
        )

    constant = cfg({})
    assert config_hash(constant) == config_hash(cfg({"plateau": {"factor": 0.1}}))
    assert config_hash(constant) == config_hash(cfg({}, every=2))  # validations: not training
    plateau = cfg({"schedule": "plateau"})
    assert config_hash(plateau) != config_hash(constant)
    assert config_hash(plateau) != config_hash(cfg({"schedule": "plateau"}, every=2))
    assert config_hash(plateau) != config_hash(
        cfg({"schedule": "plateau", "plateau": {"factor": 0.1}})
    )


def test_dropout_training_is_seeded_and_differs_from_no_dropout() -> None:
    cfg = TrainingConfig(batch_size=8, negatives=4, chunk_size=4, epochs=2, loss="cross_entropy")
    train = _triples(40)

    def fit(dropout: DropoutConfig | None) -> torch.Tensor:
        model = _model("distmult")
        Trainer(
            model, train, training=cfg, regularizer=RegularizerConfig(), seed=0, dropout=dropout
        ).fit()
        return model.entity.detach().clone()

    drop = DropoutConfig(entity=0.3, relation=0.3)
    assert torch.equal(fit(drop), fit(drop))
    assert not torch.equal(fit(drop), fit(None))
    assert torch.equal(fit(None), fit(DropoutConfig()))  # p = 0 is no dropout at all


def test_dropout_masks_continue_bit_identically_after_a_resume() -> None:
    cfg = TrainingConfig(batch_size=8, negatives=4, chunk_size=4, epochs=2, loss="cross_entropy")
    drop = DropoutConfig(entity=0.3, relation=0.3)
    train = _triples(40)
    whole = _model("complex")
    Trainer(whole, train, training=cfg, regularizer=RegularizerConfig(), seed=0, dropout=drop).fit()

    first = _model("complex")
    trainer = Trainer(
        first, train, training=cfg, regularizer=RegularizerConfig(), seed=0, dropout=drop
    )
    trainer.fit(until=1)
    state = trainer.state()
    resumed = _model("complex")
    with torch.no_grad():  # the tables come from the state, not from the same seed's init
        resumed.entity.fill_(0.25)
        resumed.relation.fill_(-0.25)
    again = Trainer(
        resumed, train, training=cfg, regularizer=RegularizerConfig(), seed=0, dropout=drop
    )
    again.load_state(state)
    again.fit()
    assert torch.equal(resumed.entity, whole.entity)
    assert torch.equal(resumed.relation, whole.relation)


def test_rotate_refuses_relation_dropout() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="rotation phases"):
        ModelConfig(name="rotate", dim=8, dropout=DropoutConfig(relation=0.1))
    ModelConfig(name="rotate", dim=8, dropout=DropoutConfig(entity=0.1))  # entities may drop


def test_callbacks_cannot_change_the_trainer() -> None:
    """The view callbacks get is read-only: setting anything on it is a clear error (it used to
    set an attribute on the trainer, where nothing read it)."""
    from kgpipe.training.hooks import Callback, NotInViewError

    class Stop(Callback):
        def on_epoch_end(self, trainer, stats) -> None:  # type: ignore[no-untyped-def]
            trainer.stop_requested = True

    cfg = TrainingConfig(batch_size=4, negatives=2, chunk_size=2, epochs=2)
    trainer = Trainer(
        _model("transe"), _triples(6), training=cfg, regularizer=RegularizerConfig(), seed=0,
        callbacks=[Stop()],
    )  # fmt: skip
    with pytest.raises(NotInViewError, match=r"trainer\.stop_requested cannot be set"):
        trainer.fit()


def test_the_view_error_survives_pickling() -> None:
    """A rank's error crosses to the driver pickled."""
    import pickle

    from kgpipe.training.hooks import NotInViewError

    err = pickle.loads(pickle.dumps(NotInViewError("model")))
    assert isinstance(err, NotInViewError) and "trainer.model is not available" in str(err)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 65_537, 272_115, 2_000_003])
def test_an_int32_permutation_is_the_int64_one_and_leaves_the_generator_alike(n: int) -> None:
    """The trainer draws each epoch's order as int32 (half the bytes): torch must give the same
    permutation as int64 and consume the generator alike, or runs would change."""
    g32, g64 = torch.Generator().manual_seed(n), torch.Generator().manual_seed(n)
    p32 = torch.randperm(n, generator=g32, dtype=torch.int32)
    p64 = torch.randperm(n, generator=g64)
    assert p32.dtype == torch.int32 and torch.equal(p32.long(), p64)
    assert torch.equal(torch.rand(5, generator=g32), torch.rand(5, generator=g64))


@pytest.mark.parametrize("betas", [(0.9, 1.0), (1.0, 0.999), (-0.1, 0.999)])
def test_adam_betas_outside_0_1_are_refused(betas: tuple[float, float]) -> None:
    """β₂ = 1 made Adam's first step 0/0 (NaN rows), β₁ = 1 a ZeroDivisionError: refused where
    the config is read, as torch.optim.Adam refuses them."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"betas\.[01]"):
        TrainingConfig(betas=betas)
    assert TrainingConfig(betas=(0.0, 0.5)).betas == (0.0, 0.5)


def test_a_diverged_epoch_stops_training_with_a_clear_error() -> None:
    """A loss that is not finite ends training before the epoch counts (it used to go on, and
    a NaN model then ranked every answer first)."""
    from kgpipe.errors import Diverged

    cfg = TrainingConfig(mode="1vsall", loss="cross_entropy", batch_size=8, lr=1e20, epochs=3)
    trainer = Trainer(_model("complex"), _triples(40), training=cfg,
                      regularizer=RegularizerConfig(), seed=0)  # fmt: skip
    with pytest.raises(Diverged, match=r"epoch 1: the training loss is (nan|inf).*training.lr"):
        trainer.fit()
    assert trainer.epoch == 0 and trainer.history == []


def test_fitting_past_the_end_of_a_decaying_schedule_is_refused() -> None:
    """``fit(epochs=...)`` past ``training.epochs`` under cosine or linear decay trained the
    extra epochs at learning rate 0 (the schedule's progress is clamped at its end)."""
    for schedule in ("cosine", "linear"):
        cfg = TrainingConfig(batch_size=8, negatives=4, epochs=1, schedule=schedule)
        trainer = Trainer(_model("distmult"), _triples(16), training=cfg,
                          regularizer=RegularizerConfig(), seed=0)  # fmt: skip
        with pytest.raises(ValueError, match="would train at rate 0"):
            trainer.fit(epochs=2)
        assert trainer.epoch == 0
        trainer.fit()  # to training.epochs: as configured
        assert trainer.epoch == 1
    cfg = TrainingConfig(batch_size=8, negatives=4, epochs=1)  # constant: any length
    trainer = Trainer(_model("distmult"), _triples(16), training=cfg,
                      regularizer=RegularizerConfig(), seed=0)  # fmt: skip
    trainer.fit(epochs=2)
    assert trainer.epoch == 2
