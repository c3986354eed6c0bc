"""One test case per registered class of every family, each against an independent reference
(the formula written out with Python numbers, torch's own optimiser, a dense gradient, a
hand-written file), plus the meta-test: a registered class without its case fails.

A family's generic case (``*Case``) holds the tests; a concrete ``Test*`` subclass names the
class (``cls``) and supplies its reference.
"""

from __future__ import annotations

import cmath
import math
from typing import Any, ClassVar

import pytest
import torch

from kgpipe.cli.ls import registries
from kgpipe.data.formats import FORMATS, ParseOptions
from kgpipe.data.formats.delimited import Csv, Tsv
from kgpipe.data.formats.ntriples import NTriples
from kgpipe.data.formats.parquet import Parquet
from kgpipe.distributed.client import open_cluster
from kgpipe.distributed.clusters import CLUSTERS, Cuda, Local
from kgpipe.distributed.gang import live_workers
from kgpipe.errors import ConfigError
from kgpipe.models.interactions import INTERACTIONS, ComplEx, DistMult, RotatE, TransE
from kgpipe.models.spec import ModelSpec
from kgpipe.registry import Registry
from kgpipe.training.losses import (
    LOSSES,
    BCELoss,
    CrossEntropyLoss,
    MarginLoss,
    SelfAdversarialLoss,
    SoftplusLoss,
)
from kgpipe.training.optim import OPTIMIZERS, RowAdagrad, RowAdam, RowGrad
from kgpipe.training.regularizers import (
    REGULARIZERS,
    LpRegularizer,
    N3Regularizer,
    NoRegularizer,
)
from kgpipe.training.schedules import SCHEDULES, Constant, Cosine, Linear, Plateau
from kgpipe.training.steps import STEPS, StepKit
from kgpipe.training.steps.kvsall import KvsAll
from kgpipe.training.steps.negative_sampling import NegativeSampling
from kgpipe.training.steps.one_vs_all import OneVsAll


class FamilyCase:
    """Base of the generic cases: the family's registry and the class under test."""

    registry: ClassVar[Registry[Any]]
    cls: ClassVar[type]

    def test_is_registered_under_its_name(self) -> None:
        assert self.registry.get(self.cls.name) is self.cls  # type: ignore[attr-defined]
        assert self.registry.describe(self.cls.name)  # type: ignore[attr-defined]


# -- models ----------------------------------------------------------------------------------------
def _c(x: torch.Tensor) -> list[complex]:
    """A [real | imaginary] row as Python complex numbers."""
    k = x.shape[-1] // 2
    return [complex(float(x[i]), float(x[k + i])) for i in range(k)]


class InteractionCase(FamilyCase):
    registry = INTERACTIONS
    options: ClassVar[dict[str, Any]] = {}

    def reference(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> float:
        raise NotImplementedError

    def test_scores_follow_the_formula(self) -> None:
        inter = self.cls(**self.options)
        g = torch.Generator().manual_seed(0)
        h, t = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
        r = torch.randn(5, inter.relation_dim(6), generator=g)
        got = inter.score(h, r, t)
        for i in range(5):
            assert float(got[i]) == pytest.approx(self.reference(h[i], r[i], t[i]), abs=1e-5)
        tails = inter.score_tails(h, r, t)  # every query against every t as a candidate
        heads = inter.score_heads(r, t, h)
        for i in range(5):
            for j in range(5):
                assert float(tails[i, j]) == pytest.approx(
                    self.reference(h[i], r[i], t[j]), abs=1e-4
                )
                assert float(heads[i, j]) == pytest.approx(
                    self.reference(h[j], r[i], t[i]), abs=1e-4
                )


class TestTransE(InteractionCase):
    cls = TransE
    options: ClassVar[dict[str, Any]] = {"p": 1, "margin": 2.0}

    def reference(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> float:
        return 2.0 - sum(abs(float(a + b - c)) for a, b, c in zip(h, r, t, strict=True))


class TestDistMult(InteractionCase):
    cls = DistMult

    def reference(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> float:
        return sum(float(a * b * c) for a, b, c in zip(h, r, t, strict=True))


class TestComplEx(InteractionCase):
    cls = ComplEx

    def reference(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> float:
        s = sum(a * b * c.conjugate() for a, b, c in zip(_c(h), _c(r), _c(t), strict=True))
        return s.real


class TestRotatE(InteractionCase):
    cls = RotatE
    options: ClassVar[dict[str, Any]] = {"margin": 3.0}

    def reference(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> float:
        rot = [cmath.exp(1j * float(p)) for p in r]
        return 3.0 - sum(abs(a * b - c) for a, b, c in zip(_c(h), rot, _c(t), strict=True))


# -- losses ----------------------------------------------------------------------------------------
def _sp(x: float) -> float:
    return math.log1p(math.exp(x))


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class LossCase(FamilyCase):
    registry = LOSSES
    options: ClassVar[dict[str, float]] = {
        "margin": 1.5,
        "temperature": 0.7,
        "label_smoothing": 0.1,
    }

    def reference(self, pos: float, neg: list[float]) -> float:
        """The loss of one positive against its negatives."""
        raise NotImplementedError

    def reference_all(self, scores: list[float], target: int) -> float | None:
        """The loss of one query against all candidates (``None``: not supported)."""
        return None

    def test_negative_sampling_follows_the_formula(self) -> None:
        g = torch.Generator().manual_seed(1)
        pos, neg = torch.randn(4, generator=g), torch.randn(4, 6, generator=g)
        got = self.cls(**self.options).negative_sampling(pos, neg)
        for i in range(4):
            ref = self.reference(float(pos[i]), [float(x) for x in neg[i]])
            assert float(got[i]) == pytest.approx(ref, rel=1e-5, abs=1e-6)

    def test_against_all_entities(self) -> None:
        g = torch.Generator().manual_seed(2)
        scores, target = torch.randn(3, 7, generator=g), torch.tensor([0, 4, 6])
        loss = self.cls(**self.options)
        refs = [self.reference_all([float(x) for x in scores[i]], int(target[i])) for i in range(3)]
        assert loss.all_entities == (refs[0] is not None)
        if refs[0] is None:
            with pytest.raises(ValueError, match="1-vs-all training supports losses"):
                loss.against_all(scores, target)
            return
        got = loss.against_all(scores, target)
        for i in range(3):
            assert float(got[i]) == pytest.approx(refs[i], rel=1e-5)


class TestMarginLoss(LossCase):
    cls = MarginLoss

    def reference(self, pos: float, neg: list[float]) -> float:
        return sum(max(0.0, 1.5 - pos + n) for n in neg) / len(neg)


class TestSoftplusLoss(LossCase):
    cls = SoftplusLoss

    def reference(self, pos: float, neg: list[float]) -> float:
        return _sp(-pos) + sum(_sp(n) for n in neg) / len(neg)


class TestSelfAdversarialLoss(LossCase):
    cls = SelfAdversarialLoss

    def reference(self, pos: float, neg: list[float]) -> float:
        w = [math.exp(0.7 * n) for n in neg]
        return -math.log(_sig(pos)) - sum(
            wi / sum(w) * math.log(_sig(-n)) for wi, n in zip(w, neg, strict=True)
        )


class TestCrossEntropyLoss(LossCase):
    cls = CrossEntropyLoss

    def _ce(self, scores: list[float], target: int) -> float:
        lse = math.log(sum(math.exp(s) for s in scores))
        eps, n = 0.1, len(scores)
        return sum(-((1 - eps) * (j == target) + eps / n) * (s - lse) for j, s in enumerate(scores))

    def reference(self, pos: float, neg: list[float]) -> float:
        return self._ce([pos, *neg], 0)

    def reference_all(self, scores: list[float], target: int) -> float | None:
        return self._ce(scores, target)


class TestBCELoss(LossCase):
    cls = BCELoss

    @staticmethod
    def _bce(x: float, y: float) -> float:
        return -(y * math.log(_sig(x)) + (1 - y) * math.log(1 - _sig(x)))

    def reference(self, pos: float, neg: list[float]) -> float:
        return self._bce(pos, 0.9) + sum(self._bce(n, 0.1) for n in neg) / len(neg)

    def reference_all(self, scores: list[float], target: int) -> float | None:
        n = len(scores)
        return sum(self._bce(s, (j == target) * 0.9 + 0.1 / n) for j, s in enumerate(scores))


# -- optimisers: against torch.optim on rows touched every step -------------------------------------
class OptimizerCase(FamilyCase):
    registry = OPTIMIZERS

    def reference(self, param: torch.nn.Parameter) -> torch.optim.Optimizer:
        raise NotImplementedError

    def test_steps_equal_torch_optim(self) -> None:
        g = torch.Generator().manual_seed(3)
        table = torch.randn(5, 3, generator=g, dtype=torch.float64)
        param = torch.nn.Parameter(table.clone())
        ours = self.cls({"e": table}, lr=0.05, betas=(0.8, 0.95), eps=1e-8)
        ref = self.reference(param)
        for _ in range(4):
            grad = torch.randn(5, 3, generator=g, dtype=torch.float64)
            ours.step({"e": RowGrad(torch.arange(5), grad)})
            param.grad = grad.clone()
            ref.step()
        torch.testing.assert_close(table, param.detach())


class TestRowAdam(OptimizerCase):
    cls = RowAdam

    def reference(self, param: torch.nn.Parameter) -> torch.optim.Optimizer:
        return torch.optim.Adam([param], lr=0.05, betas=(0.8, 0.95), eps=1e-8)


class TestRowAdagrad(OptimizerCase):
    cls = RowAdagrad

    def reference(self, param: torch.nn.Parameter) -> torch.optim.Optimizer:
        return torch.optim.Adagrad([param], lr=0.05, eps=1e-8)


# -- schedules: the rates over a short run, by hand ---------------------------------------------------
class ScheduleCase(FamilyCase):
    registry = SCHEDULES
    expected: ClassVar[list[float]]  # rates of steps 0..5, base 1, warm-up 2, 6 steps in all

    def test_rates(self) -> None:
        s = self.cls(base=1.0, warmup_steps=2, total_steps=6, factor=0.5, patience=0, threshold=0)
        s.observe([0.5, 0.4])  # a validation that got worse: a plateau cut
        assert [s.rate(i) for i in range(6)] == pytest.approx(self.expected)


class TestConstant(ScheduleCase):
    cls = Constant
    expected: ClassVar[list[Any]] = [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]


class TestCosine(ScheduleCase):
    cls = Cosine
    expected: ClassVar[list[Any]] = [0.5, 1.0] + [
        0.5 * (1 + math.cos(math.pi * (k - 2) / 4)) for k in range(2, 6)
    ]


class TestLinear(ScheduleCase):
    cls = Linear
    expected: ClassVar[list[Any]] = [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]


class TestPlateau(ScheduleCase):
    cls = Plateau
    expected: ClassVar[list[Any]] = [0.25, 0.5, 0.5, 0.5, 0.5, 0.5]  # halved once: 0.4 < 0.5


# -- regularisers: hand-computed -------------------------------------------------------------------
class RegularizerCase(FamilyCase):
    registry = REGULARIZERS
    expected: ClassVar[dict[str, float]]  # per interaction: 0.5 * penalty of the rows below

    @pytest.mark.parametrize("model", ["distmult", "complex", "rotate"])
    def test_penalty(self, model: str) -> None:
        inter = INTERACTIONS.get(model)()
        h, t = torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 1.0]])
        r = torch.tensor([[1.0, -2.0]])[:, : inter.relation_dim(2)]
        reg = self.cls(inter, weight=0.5, p=1.0)
        assert float(reg(h, r, t)) == pytest.approx(self.expected[model])


class TestNoRegularizer(RegularizerCase):
    cls = NoRegularizer
    expected: ClassVar[dict[str, float]] = {"distmult": 0.0, "complex": 0.0, "rotate": 0.0}


class TestLpRegularizer(RegularizerCase):
    cls = LpRegularizer  # p = 1: sum of absolute values; a rotation's phase is not penalised
    expected: ClassVar[dict[str, float]] = {
        "distmult": 0.5 * (7 + 3 + 1),
        "complex": 0.5 * (7 + 3 + 1),
        "rotate": 0.5 * 8,
    }


class TestN3Regularizer(RegularizerCase):
    cls = N3Regularizer  # over complex moduli for complex rows: |3+4i|^3 = 125
    expected: ClassVar[dict[str, float]] = {
        "distmult": 0.5 * (27 + 64 + 1 + 8 + 1),
        "complex": 0.5 * (125 + 5**1.5 + 1),
        "rotate": 0.5 * (125 + 1),
    }


# -- step strategies: the gradient of a dense, per-query computation -----------------------------------
NE, NR = 9, 2


def _kit(mode: str, *, dim: int = 4, loss: str = "cross_entropy") -> tuple[StepKit, Any]:
    spec = ModelSpec("distmult", dim, NE, NR)
    g = torch.Generator().manual_seed(4)
    tables = {
        "entity": torch.randn(NE, dim, generator=g),
        "relation": torch.randn(NR, dim, generator=g),
    }
    inter = DistMult()
    kit = StepKit(
        interaction=inter,
        spec=spec,
        tables=tables,
        device=torch.device("cpu"),
        loss=LOSSES.get(loss)(),
        regularizer=NoRegularizer(inter),
        dropout=None,
        bf16=False,
        part=(0, 1),
    )
    return kit, tables


def _triples(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return torch.stack(
        [torch.randint(0, NE, (n,), generator=g), torch.randint(0, NR, (n,), generator=g),
         torch.randint(0, NE, (n,), generator=g)], 1
    )  # fmt: skip


class StepCase(FamilyCase):
    registry = STEPS

    def dense_loss(
        self, strategy: Any, ent: torch.Tensor, rel: torch.Tensor, batch: torch.Tensor, draws: Any
    ) -> torch.Tensor:
        """The summed loss of the batch, one query at a time, on dense tables."""
        raise NotImplementedError

    def test_gradients_equal_a_dense_per_query_computation(self) -> None:
        kit, tables = _kit(self.cls.name)
        train = _triples(8)
        strategy = self.cls(kit, train, chunk_size=3, negatives=4)
        n = strategy.examples()
        batch = strategy.batch(torch.arange(n))
        draws = strategy.draw(n, torch.Generator().manual_seed(6))
        queries = strategy.global_queries(n)
        res = strategy.gradients(
            batch, draws, global_step=0, global_queries=queries, global_batch=n
        )
        ent = tables["entity"].clone().requires_grad_()
        rel = tables["relation"].clone().requires_grad_()
        (self.dense_loss(strategy, ent, rel, batch, draws) / queries).backward()
        for name, ref in (("entity", ent.grad), ("relation", rel.grad)):
            dense = torch.zeros_like(ref)
            dense[res.grads[name].rows] = res.grads[name].values
            torch.testing.assert_close(dense, ref, rtol=1e-4, atol=1e-6)


def _ce(scores: torch.Tensor, target: int) -> torch.Tensor:
    return torch.logsumexp(scores, 0) - scores[target]


class TestNegativeSampling(StepCase):
    cls = NegativeSampling

    def dense_loss(self, strategy, ent, rel, batch, draws):  # type: ignore[no-untyped-def]
        total = ent.new_zeros(())
        n_tail = (batch.shape[0] + 1) // 2  # tails corrupted for the first half, chunks of 3
        for i, (h, r, t) in enumerate(batch.tolist()):
            chunk = i // 3 if i < n_tail else (n_tail + 2) // 3 + (i - n_tail) // 3
            cands = draws[chunk].tolist()
            if i < n_tail:
                scores = [ent[h] @ (rel[r] * ent[t])] + [ent[h] @ (rel[r] * ent[c]) for c in cands]
            else:
                scores = [ent[h] @ (rel[r] * ent[t])] + [ent[c] @ (rel[r] * ent[t]) for c in cands]
            total = total + _ce(torch.stack(scores), 0)
        return total


class TestOneVsAll(StepCase):
    cls = OneVsAll

    def dense_loss(self, strategy, ent, rel, batch, draws):  # type: ignore[no-untyped-def]
        total = ent.new_zeros(())
        for h, r, t in batch.tolist():
            total = total + _ce((ent[h] * rel[r]) @ ent.T, t) + _ce(ent @ (rel[r] * ent[t]), h)
        return total


class TestKvsAll(StepCase):
    cls = KvsAll

    def dense_loss(self, strategy, ent, rel, batch, draws):  # type: ignore[no-untyped-def]
        train = strategy.train.tolist()
        total = ent.new_zeros(())
        for q in batch.tolist():
            a, r, side = (int(x[q]) for x in (strategy.index.anchor, strategy.index.relation,
                                              strategy.index.side))  # fmt: skip
            if side == 0:
                scores, answers = (
                    (ent[a] * rel[r]) @ ent.T,
                    {t for h, rr, t in train if (h, rr) == (a, r)},
                )
            else:
                scores, answers = (
                    ent @ (rel[r] * ent[a]),
                    {h for h, rr, t in train if (rr, t) == (r, a)},
                )
            log_p = torch.log_softmax(scores, 0)
            total = total - sum(log_p[e] for e in answers) / len(answers)
        return total


# -- file formats: a small file of each, written by hand -------------------------------------------
class FormatCase(FamilyCase):
    registry = FORMATS
    data: ClassVar[bytes]
    expected: ClassVar[list[tuple[str, str, str]]]

    def content(self) -> bytes:
        return self.data

    def test_parses_a_small_file(self) -> None:
        out = self.cls().parse(self.content(), source="x", options=ParseOptions())
        assert list(zip(out.heads, out.relations, out.tails, strict=True)) == self.expected
        assert all(ext.startswith(".") for ext in self.cls.extensions)


class TestTsv(FormatCase):
    cls = Tsv
    data = b"a\tr\tb\n# note\nb\ts\tc\n"
    expected: ClassVar[list[Any]] = [("a", "r", "b"), ("b", "s", "c")]


class TestCsv(FormatCase):
    cls = Csv
    data = b'a,r,"b, c"\nd,s,e\n'
    expected: ClassVar[list[Any]] = [("a", "r", "b, c"), ("d", "s", "e")]


class TestNTriples(FormatCase):
    cls = NTriples
    data = b'<http://x/a> <http://x/r> <http://x/b> .\n<http://x/a> <http://x/r> "lit" .\n'
    expected: ClassVar[list[Any]] = [("http://x/a", "http://x/r", "http://x/b")]


class TestParquet(FormatCase):
    cls = Parquet
    expected: ClassVar[list[Any]] = [("a", "r", "b"), ("c", "s", "d")]

    def content(self) -> bytes:
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        table = pa.table({"head": ["a", "c"], "relation": ["r", "s"], "tail": ["b", "d"]})
        pq.write_table(table, buf)
        return buf.getvalue()


# -- clusters ----------------------------------------------------------------------------------------
class ClusterCase(FamilyCase):
    registry = CLUSTERS


class TestLocal(ClusterCase):
    cls = Local

    def test_starts_workers_on_loopback(self) -> None:
        with open_cluster("local", workers=1, threads_per_worker=1) as client:
            workers = live_workers(client)
            assert len(workers) == 1
            assert all(a.startswith("tcp://127.0.0.1:") for a in workers)
            assert client.submit(lambda: 6 * 7).result() == 42


class TestCuda(ClusterCase):
    cls = Cuda

    def test_refuses_clearly_without_dask_cuda_or_a_gpu(self) -> None:
        if torch.cuda.is_available():
            pytest.skip("a GPU is here: bench/gpu_check.sh runs the CUDA cluster")
        with pytest.raises(ConfigError, match="cuda"):
            Cuda().start(workers=1, threads=1, env={}, worker_ttl_s=60.0)


# -- the meta-test -----------------------------------------------------------------------------------
def _cases() -> list[type[FamilyCase]]:
    out, todo = [], list(FamilyCase.__subclasses__())
    while todo:
        c = todo.pop()
        todo += c.__subclasses__()
        if "cls" in vars(c):
            out.append(c)
    return out


def uncovered() -> list[str]:
    """Registered classes that no case of their family tests."""
    covered = {(c.registry.family, c.cls) for c in _cases()}
    return [
        f"{reg.family} {name!r} ({reg.get(name).__name__})"
        for _, reg in registries()
        for name in reg
        if (reg.family, reg.get(name)) not in covered
    ]


def test_every_registered_class_has_its_case() -> None:
    assert uncovered() == []


def test_a_registered_class_without_a_case_fails_the_meta_test() -> None:
    @LOSSES.register("untested")
    class Untested(MarginLoss):
        """A loss nobody wrote a case for."""

    try:
        assert uncovered() == ["loss 'untested' (Untested)"]
    finally:
        LOSSES._classes.pop("untested")


def test_a_class_registered_after_the_config_is_a_valid_name() -> None:
    """A plug-in registers its model after kgpipe.config was imported: configs accept the name
    and the JSON schema (the Prefect UI's form) lists it."""
    from kgpipe.config import RunConfig, parse_config

    @INTERACTIONS.register("plugin-model")
    class PluginModel(DistMult):
        """A DistMult under another name."""

    try:
        config = parse_config({"data": {"dataset": "umls"}, "model": {"name": "plugin-model"}})
        assert config.model.name == "plugin-model"
        schema = RunConfig.model_json_schema()["$defs"]["ModelConfig"]["properties"]["name"]
        assert "plugin-model" in schema["enum"]
    finally:
        INTERACTIONS._classes.pop("plugin-model")


def test_a_scheduler_address_is_a_url_dask_can_connect_with() -> None:
    """``distributed.cluster`` and ``kgpipe tune --cluster`` take a scheduler address; a URL of
    a scheme Dask has no comm for is none (``kgpipe tune --cluster s3://bucket`` reached Dask's
    ``ValueError: unknown address scheme 's3'`` as a traceback), so the config names the key."""
    from kgpipe.config import parse_config
    from kgpipe.distributed.clusters import is_address

    for good in ("tcp://10.0.0.1:8786", "TLS://h:1", "ws://h:1", "inproc://x", "h:8786"):
        assert is_address(good), good
    for bad in ("s3://bucket/out", "http://h:1", "file:///x", "abc", "", "0"):
        assert not is_address(bad), bad
    with pytest.raises(ConfigError, match=r"distributed\.cluster: unknown cluster"):
        parse_config({"data": {"dataset": "umls"}, "distributed": {"cluster": "s3://b/x"}})
    # a comm backend a plug-in registers with Dask makes its scheme an address
    from distributed.comm.registry import backends

    assert not is_address("kgpipe-test://h:1")
    backends["kgpipe-test"] = backends["tcp"]
    try:
        assert is_address("kgpipe-test://h:1")
    finally:
        del backends["kgpipe-test"]
