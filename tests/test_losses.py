"""The fused 1-vs-all losses against PyTorch's own cross-entropy (values and gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kgpipe.training.losses import (
    linear_softmax_cross_entropy,
    one_vs_all_loss,
    softmax_cross_entropy,
)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_softmax_cross_entropy_equals_torch(eps: float) -> None:
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(7, 50, dtype=torch.float64, generator=gen, requires_grad=True)
    target = torch.randint(0, 50, (7,), generator=gen)
    weights = torch.randn(7, dtype=torch.float64, generator=gen)
    ours = softmax_cross_entropy(scores, target, eps)
    ref = F.cross_entropy(scores, target, reduction="none", label_smoothing=eps)
    torch.testing.assert_close(ours, ref)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), scores)
    (g_ref,) = torch.autograd.grad((ref * weights).sum(), scores)
    torch.testing.assert_close(g_ours, g_ref)
    assert torch.autograd.gradcheck(lambda x: softmax_cross_entropy(x, target, eps), (scores,))


def test_softmax_cross_entropy_leaves_its_input_alone() -> None:
    scores = torch.randn(4, 9, requires_grad=True)
    before = scores.detach().clone()
    softmax_cross_entropy(scores, torch.tensor([0, 3, 8, 2])).sum().backward()
    assert torch.equal(scores.detach(), before)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("block", [1, 4, 64])  # blocks that do and do not divide the rows
def test_linear_softmax_cross_entropy_equals_unfused(eps: float, block: int) -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(9, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    cand = torch.randn(20, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    target = torch.randint(0, 20, (9,), generator=gen)
    ours = linear_softmax_cross_entropy(q, cand, target, label_smoothing=eps, block=block)
    ref = F.cross_entropy(q @ cand.T, target, reduction="sum", label_smoothing=eps)
    torch.testing.assert_close(ours, ref)
    g_ours = torch.autograd.grad(ours * 3.0, (q, cand))
    g_ref = torch.autograd.grad(ref * 3.0, (q, cand))
    for a, b in zip(g_ours, g_ref, strict=True):
        torch.testing.assert_close(a, b)


def test_linear_softmax_cross_entropy_bf16_is_close_to_fp32() -> None:
    gen = torch.Generator().manual_seed(2)
    q = (0.3 * torch.randn(64, 32, generator=gen)).requires_grad_(True)
    cand = (0.3 * torch.randn(500, 32, generator=gen)).requires_grad_(True)
    target = torch.randint(0, 500, (64,), generator=gen)
    full = linear_softmax_cross_entropy(q, cand, target)
    half = linear_softmax_cross_entropy(q, cand, target, dtype=torch.bfloat16, block=16)
    assert abs(half.item() - full.item()) < 1e-2 * abs(full.item())
    for a, b in zip(
        torch.autograd.grad(half, (q, cand)), torch.autograd.grad(full, (q, cand)), strict=True
    ):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.0, atol=2e-2 * float(b.abs().max()))


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_kvsall_cross_entropy_targets_the_uniform_distribution_over_answers(eps: float) -> None:
    """Hand-computed: a row with answers {1, 3} among 4 entities has the target distribution
    (0, 1/2, 0, 1/2), smoothed towards (1/4, 1/4, 1/4, 1/4) by eps."""
    scores = torch.tensor([[0.5, 2.0, -1.0, 0.0], [1.0, 1.0, 3.0, -2.0]])
    labels = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    got = one_vs_all_loss("cross_entropy", scores, labels, label_smoothing=eps)
    expected = []
    for row, answers in ((0, (1, 3)), (1, (2,))):
        log_p = [float(scores[row, j]) - float(torch.logsumexp(scores[row], 0)) for j in range(4)]
        target = [(1 - eps) * (j in answers) / len(answers) + eps / 4 for j in range(4)]
        expected.append(-sum(t * lp for t, lp in zip(target, log_p, strict=True)))
    torch.testing.assert_close(got, torch.tensor(expected))
    # one answer per row: the 1-vs-all loss against its class id
    one = one_vs_all_loss("cross_entropy", scores[1:], labels[1:], label_smoothing=eps)
    ids = one_vs_all_loss("cross_entropy", scores[1:], torch.tensor([2]), label_smoothing=eps)
    torch.testing.assert_close(one, ids)
