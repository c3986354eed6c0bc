"""Stateless interaction functions: the scoring functions of the models.

Every interaction takes embeddings, never ids, and holds no parameters. Higher scores mean "more
plausible". Three entry points per model:

* :meth:`Interaction.score` -- one score per triple. ``h, r, t`` broadcast against each other:
  shapes ``(*batch, d)`` (relations ``(*batch, d_r)``), result ``(*batch,)``.
* :meth:`Interaction.score_tails` -- each query ``(h, r)`` against a set of candidate tails.
  ``h``: ``(*g, b, d)``, ``r``: ``(*g, b, d_r)``, ``candidates``: ``(*g, n, d)``; result
  ``(*g, b, n)``. With ``g`` a leading chunk dimension this scores *shared negatives*: every
  query in a chunk against the chunk's ``n`` negatives, as one batched matrix product. With
  ``candidates`` the whole entity table this is 1-vs-all scoring for evaluation.
* :meth:`Interaction.score_heads` -- likewise for queries ``(r, t)`` against candidate heads.

Layouts (these are also the layouts of exported embeddings):

* TransE, DistMult: entity and relation rows are real vectors of ``dim``.
* ComplEx: an entity or relation row of ``dim`` reals is ``dim/2`` complex numbers stored as
  ``[real parts | imaginary parts]``.
* RotatE: entities as ComplEx; a relation row holds ``dim/2`` phases θ (radians), the relation
  being the unit complex vector ``cos θ + i sin θ``.

Scores:

* TransE: ``γ - ‖h + r - t‖_p`` (p = 1 or 2).
* DistMult: ``Σ h ⊙ r ⊙ t``.
* ComplEx: ``Re(Σ h ⊙ r ⊙ conj(t))``.
* RotatE: ``γ - Σ_k |h_k r_k - t_k|`` (sum of complex moduli).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from kgpipe.models.distances import sqdist_mm
from kgpipe.registry import Registry

log = logging.getLogger("kgpipe.models")

__all__ = [
    "INTERACTIONS",
    "BilinearInteraction",
    "ComplEx",
    "DistMult",
    "Interaction",
    "RotatE",
    "TransE",
    "get_interaction",
]


class Interaction(ABC):
    """A scoring function over embeddings (see the module docstring for shapes).

    Besides scoring, a class states the traits that the rest of kgpipe reads instead of asking
    which model it is: how its rows are laid out, what its relations are, which options apply.
    """

    #: registry name (set by ``@INTERACTIONS.register``)
    name: ClassVar[str]
    #: the score function in words, stored with exported embeddings
    scoring: ClassVar[str]
    #: rough multiply-adds per (query, candidate) pair and dimension, for GFLOP/s reports
    flops_per_pair_dim: ClassVar[float] = 2.0
    #: rows are ``dim/2`` complex numbers ``[real parts | imaginary parts]`` (``dim`` even;
    #: the N3 penalty is taken over complex moduli)
    complex_rows: ClassVar[bool] = False
    #: relation rows are rotation phases: initialised uniformly in ``[-π, π]``, never dropped
    #: out (a zeroed phase is another rotation, not a weaker one) and never regularised
    phase_relations: ClassVar[bool] = False
    #: scores carry the offset γ of ``model.margin``
    uses_margin: ClassVar[bool] = False
    #: scores are matrix products ``query @ candidates.T``: worth running in bfloat16, and
    #: fusable with a softmax loss
    bilinear: ClassVar[bool] = False

    def __init__(self, *, p: int = 2, margin: float = 0.0) -> None:
        """Every interaction takes the model options it might use (``model.p``, ``.margin``)."""
        self.margin = margin if self.uses_margin else 0.0

    def relation_dim(self, dim: int) -> int:
        """Width of a relation row for entity rows of width ``dim``."""
        return dim

    @abstractmethod
    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        """Scores of triples, shape ``(*batch,)``."""

    @abstractmethod
    def score_tails(self, h: Tensor, r: Tensor, candidates: Tensor) -> Tensor:
        """Scores ``(*g, b, n)`` of queries ``(h, r, ?)`` against candidate tails."""

    @abstractmethod
    def score_heads(self, r: Tensor, t: Tensor, candidates: Tensor) -> Tensor:
        """Scores ``(*g, b, n)`` of queries ``(?, r, t)`` against candidate heads."""


INTERACTIONS: Registry[Interaction] = Registry(
    "model", doc="interaction (scoring) functions: model.name"
)


class BilinearInteraction(Interaction):
    """A model whose tail scores are a product ``tail_query(h, r) @ candidates.T``: training can
    then fuse the product with the loss (:func:`~kgpipe.training.losses.linear_softmax_cross_entropy`).
    """

    bilinear = True

    @abstractmethod
    def tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        """The vectors ``q`` with ``score_tails(h, r, c) == q @ c.T``."""

    def score_tails(self, h: Tensor, r: Tensor, candidates: Tensor) -> Tensor:
        return self.tail_query(h, r) @ candidates.transpose(-1, -2)


def _split(x: Tensor) -> tuple[Tensor, Tensor]:
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


@INTERACTIONS.register("transe")
class TransE(Interaction):
    """Translational distance ``γ - ‖h + r - t‖_p`` (Bordes et al., 2013)."""

    scoring = "score(h,r,t) = gamma - ||h + r - t||_p  (real vectors of dim)"
    uses_margin = True

    def __init__(self, *, p: int = 2, margin: float = 0.0) -> None:
        super().__init__(p=p, margin=margin)
        if p not in (1, 2):
            raise ValueError("TransE supports p = 1 or 2")
        self.p = p

    def _dist(self, q: Tensor, c: Tensor) -> Tensor:
        if self.p == 2:
            return sqdist_mm(q, c).sqrt()
        return torch.cdist(q, c, p=1.0)

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        diff = h + r - t
        if self.p == 2:
            return self.margin - ((diff * diff).sum(-1) + 1e-12).sqrt()
        return self.margin - diff.abs().sum(-1)

    def score_tails(self, h: Tensor, r: Tensor, candidates: Tensor) -> Tensor:
        return self.margin - self._dist(h + r, candidates)

    def score_heads(self, r: Tensor, t: Tensor, candidates: Tensor) -> Tensor:
        return self.margin - self._dist(t - r, candidates)


@INTERACTIONS.register("distmult")
class DistMult(BilinearInteraction):
    """Bilinear diagonal ``Σ h ⊙ r ⊙ t`` (Yang et al., 2015)."""

    scoring = "score(h,r,t) = sum(h * r * t)  (real vectors of dim)"

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        return (h * r * t).sum(-1)

    def tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return h * r

    def score_heads(self, r: Tensor, t: Tensor, candidates: Tensor) -> Tensor:
        return (r * t) @ candidates.transpose(-1, -2)


@INTERACTIONS.register("complex")
class ComplEx(BilinearInteraction):
    """``Re(Σ h ⊙ r ⊙ conj(t))`` over ``dim/2`` complex components (Trouillon et al., 2016)."""

    scoring = (
        "score(h,r,t) = Re(sum(h * r * conj(t))); rows are dim/2 complex numbers stored as "
        "[real parts | imaginary parts]"
    )
    complex_rows = True

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        hr, hi = _split(h)
        rr, ri = _split(r)
        tr, ti = _split(t)
        return ((hr * rr - hi * ri) * tr + (hr * ri + hi * rr) * ti).sum(-1)

    def tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        hr, hi = _split(h)
        rr, ri = _split(r)
        # Re(<q, conj t>) = q_re·t_re + q_im·t_im with q = h*r
        return torch.cat((hr * rr - hi * ri, hr * ri + hi * rr), dim=-1)

    def score_heads(self, r: Tensor, t: Tensor, candidates: Tensor) -> Tensor:
        rr, ri = _split(r)
        tr, ti = _split(t)
        # Re(<h, x>) with x = r*conj(t) = h_re·x_re - h_im·x_im
        x_re = rr * tr + ri * ti
        x_im = ri * tr - rr * ti
        q = torch.cat((x_re, -x_im), dim=-1)
        return q @ candidates.transpose(-1, -2)


_SLICE_ELEMENTS = 1 << 19  # (b, m, k) elements per slice: 2 MiB of float32, cache-sized
_EPS = 1e-12  # inside RotatE's square roots: a finite gradient at zero distance


def _step(qr: Tensor, n: int) -> int:
    """Candidates per slice, so that one slice's ``(*g, b, m, k)`` differences stay in cache."""
    return max(1, min(n, _SLICE_ELEMENTS // max(1, qr.numel())))


class _ModulusSum(torch.autograd.Function):
    """``out[..., b, j] = Σ_k sqrt((qr - cr_j)² + (qi - ci_j)² + ε)`` over cache-sized slices.

    ``qr, qi``: ``(*g, b, k)``; ``cr, ci``: ``(*g, n, k)`` or ``(n, k)``. The autograd form of
    the same expression materialises five ``(b, n, k)`` temporaries and keeps three for the
    backward pass: memory-bound, several times slower for RotatE's shared negatives
    (docs/benchmarks.md, RotatE). Here the forward pass keeps only the inputs, and the
    backward pass recomputes each slice: ``∂/∂q = g·(q - c)/dist`` summed over candidates,
    ``∂/∂c = -g·(q - c)/dist`` summed over queries.
    """

    @staticmethod
    def forward(ctx: Any, qr: Tensor, qi: Tensor, cr: Tensor, ci: Tensor) -> Tensor:
        ctx.save_for_backward(qr, qi, cr, ci)
        n = cr.shape[-2]
        step = _step(qr, n)
        out = qr.new_empty((*torch.broadcast_shapes(qr.shape[:-2], cr.shape[:-2]), qr.shape[-2], n))
        qr_, qi_ = qr.unsqueeze(-2), qi.unsqueeze(-2)
        for s in range(0, n, step):
            dr = qr_ - cr[..., s : s + step, :].unsqueeze(-3)
            di = qi_ - ci[..., s : s + step, :].unsqueeze(-3)
            dr.mul_(dr).addcmul_(di, di).add_(_EPS).sqrt_()
            torch.sum(dr, dim=-1, out=out[..., s : s + step])
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        qr, qi, cr, ci = ctx.saved_tensors
        n = cr.shape[-2]
        step = _step(qr, n)
        need_q = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        need_c = ctx.needs_input_grad[2] or ctx.needs_input_grad[3]
        full = (*grad.shape[:-2], qr.shape[-2], qr.shape[-1])  # broadcast query shape
        gqr = qr.new_zeros(full) if need_q else None
        gqi = qi.new_zeros(full) if need_q else None
        gcr = torch.zeros_like(cr) if need_c else None
        gci = torch.zeros_like(ci) if need_c else None
        qr_, qi_ = qr.unsqueeze(-2), qi.unsqueeze(-2)
        for s in range(0, n, step):
            cs_r, cs_i = cr[..., s : s + step, :], ci[..., s : s + step, :]
            dr = qr_ - cs_r.unsqueeze(-3)  # (*g, b, m, k)
            di = qi_ - cs_i.unsqueeze(-3)
            w = torch.addcmul(di * di, dr, dr).add_(_EPS).sqrt_()
            torch.div(grad[..., s : s + step].unsqueeze(-1), w, out=w)  # g / dist
            dr.mul_(w)
            di.mul_(w)
            if need_q:
                assert gqr is not None and gqi is not None
                gqr.add_(dr.sum(-2))
                gqi.add_(di.sum(-2))
            if need_c:
                assert gcr is not None and gci is not None
                gcr[..., s : s + step, :].sub_(dr.sum(-3).sum_to_size(cs_r.shape))
                gci[..., s : s + step, :].sub_(di.sum(-3).sum_to_size(cs_i.shape))
        if need_q:
            assert gqr is not None and gqi is not None
            gqr, gqi = gqr.sum_to_size(qr.shape), gqi.sum_to_size(qi.shape)
        return gqr, gqi, gcr, gci


def _modulus_sum_expr(qr: Tensor, qi: Tensor, cr: Tensor, ci: Tensor) -> Tensor:
    """The plain ``(b, n, k)`` expression of :class:`_ModulusSum`, for torch.compile: Inductor
    fuses it, and its backward, into loops that never materialise the differences."""
    dr = qr.unsqueeze(-2) - cr.unsqueeze(-3)
    di = qi.unsqueeze(-2) - ci.unsqueeze(-3)
    return torch.sqrt(dr * dr + di * di + _EPS).sum(-1)


# Calls smaller than this many (query, candidate, component) elements stay eager: compiling a
# new shape takes tens of seconds, which only large, repeated calls (training steps, ranking
# against all entities) win back.
COMPILE_MIN_ELEMENTS = 1 << 22
# ... and so do calls of few queries (a `predict`): one query against 14,541 entities of d=1000
# took 21 s to compile on a cold cache and 0.4 s eager, whose later calls take 0.01 s.
COMPILE_MIN_QUERIES = 64
_compiled: Callable[..., Tensor] | None = None
_compile_failed = False


def _fused_modulus_sum(qr: Tensor, qi: Tensor, cr: Tensor, ci: Tensor) -> Tensor | None:
    """The compiled modulus sum, or None where compiling is unavailable (no C++ compiler, an
    unsupported platform): the caller then uses the eager kernel."""
    global _compiled, _compile_failed
    if _compile_failed:
        return None
    if _compiled is None:
        _compiled = torch.compile(_modulus_sum_expr)
    try:
        return _compiled(qr, qi, cr, ci)
    except Exception as err:  # torch raises backend-specific types; any failure means eager
        _compile_failed = True
        log.warning("torch.compile of RotatE's distances failed; using the eager kernel: %s", err)
        return None


@INTERACTIONS.register("rotate")
class RotatE(Interaction):
    """Rotation in complex space ``γ - Σ_k |h_k r_k - t_k|`` (Sun et al., 2019)."""

    scoring = (
        "score(h,r,t) = gamma - sum_k |h_k * r_k - t_k| (complex modulus); entity rows are dim/2 "
        "complex numbers stored as [real parts | imaginary parts]; relation rows are dim/2 phases "
        "theta in radians, r_k = cos(theta_k) + i sin(theta_k)"
    )
    flops_per_pair_dim = 4.0  # per complex component: 2 sub, 2 mul+add, sqrt counted as one
    complex_rows = True
    phase_relations = True
    uses_margin = True

    def __init__(self, *, p: int = 2, margin: float = 0.0, compiled: bool = True) -> None:
        super().__init__(p=p, margin=margin)
        # torch.compile the (query x candidate) distances of large calls: there is no matrix
        # product to lean on, and the fused kernel is the faster one (docs/benchmarks.md, RotatE)
        self.compiled = compiled

    def relation_dim(self, dim: int) -> int:
        return dim // 2

    @staticmethod
    def _rotate(x: Tensor, phase: Tensor, *, conj: bool = False) -> tuple[Tensor, Tensor]:
        xr, xi = _split(x)
        c, s = torch.cos(phase), torch.sin(phase)
        if conj:
            s = -s
        return xr * c - xi * s, xr * s + xi * c

    def _modulus_sum(self, qr: Tensor, qi: Tensor, candidates: Tensor) -> Tensor:
        """``Σ_k |q_k - c_k|`` for every (query, candidate) pair, ``(*g, b, n)``.

        There is no matrix-product form: the ``(b, n, k)`` differences are needed element by
        element. They are never materialised whole. Large calls run a torch.compile'd kernel
        that fuses the differences, the moduli and the sum (and the same for the backward
        pass); small calls, and machines where compiling fails, use :class:`_ModulusSum`,
        which walks cache-sized slices of candidates in place and recomputes each slice's
        differences in the backward pass instead of keeping them.
        """
        cr, ci = _split(candidates)
        if self.compiled and qr.numel() and cr.numel():  # (an empty side: no kernel to run)
            b, n, k = qr.shape[-2], cr.shape[-2], qr.shape[-1]
            groups = max(qr.numel() // (b * k), cr.numel() // (n * k), 1)
            if groups * b >= COMPILE_MIN_QUERIES and groups * b * n * k >= COMPILE_MIN_ELEMENTS:
                out = _fused_modulus_sum(qr, qi, cr, ci)
                if out is not None:
                    return out
        return _ModulusSum.apply(qr, qi, cr, ci)

    def score(self, h: Tensor, r: Tensor, t: Tensor) -> Tensor:
        qr, qi = self._rotate(h, r)
        tr, ti = _split(t)
        dr, di = qr - tr, qi - ti
        return self.margin - torch.sqrt(dr * dr + di * di + _EPS).sum(-1)

    def score_tails(self, h: Tensor, r: Tensor, candidates: Tensor) -> Tensor:
        qr, qi = self._rotate(h, r)
        return self.margin - self._modulus_sum(qr, qi, candidates)

    def score_heads(self, r: Tensor, t: Tensor, candidates: Tensor) -> Tensor:
        # |h∘r - t| = |h - t∘conj(r)| because |r_k| = 1
        qr, qi = self._rotate(t, r, conj=True)
        return self.margin - self._modulus_sum(qr, qi, candidates)


def get_interaction(name: str, *, p: int = 2, margin: float = 0.0) -> Interaction:
    """Build an interaction by registry name; unknown names list the known ones."""
    return INTERACTIONS.get(name)(p=p, margin=margin)
