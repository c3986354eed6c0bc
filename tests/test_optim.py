"""Row-wise optimisers against torch.optim's dense implementations."""

from __future__ import annotations

import math

import pytest
import torch

from kgpipe.training.optim import RowAdagrad, RowAdam, RowGrad
from kgpipe.training.schedules import lr_at, plateau_lr


def _steps(
    seed: int, n: int, rows: int, dim: int, fixed: bool
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    base = torch.tensor([1, 4, 7])
    for _ in range(n):
        idx = base if fixed else torch.unique(torch.randint(0, rows, (4,), generator=g))
        out.append((idx, torch.randn(idx.numel(), dim, generator=g, dtype=torch.float64)))
    return out


def _dense(rows: int, dim: int, idx: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
    d = torch.zeros(rows, dim, dtype=torch.float64)
    d[idx] = vals
    return d


def test_adagrad_equals_dense_adagrad_on_any_rows() -> None:
    rows, dim = 10, 3
    init = torch.randn(rows, dim, dtype=torch.float64)
    table = init.clone()
    opt = RowAdagrad({"e": table}, lr=0.3, eps=1e-10)
    ref = torch.nn.Parameter(init.clone())
    ref_opt = torch.optim.Adagrad([ref], lr=0.3, eps=1e-10)
    for idx, vals in _steps(0, 6, rows, dim, fixed=False):
        opt.step({"e": RowGrad(idx, vals)})
        ref.grad = _dense(rows, dim, idx, vals)
        ref_opt.step()
    torch.testing.assert_close(table, ref.data, rtol=1e-12, atol=1e-12)


def test_adam_equals_dense_adam_when_the_same_rows_are_touched() -> None:
    rows, dim = 10, 3
    init = torch.randn(rows, dim, dtype=torch.float64)
    table = init.clone()
    opt = RowAdam({"e": table}, lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    ref = torch.nn.Parameter(init.clone())
    ref_opt = torch.optim.Adam([ref], lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    for idx, vals in _steps(1, 8, rows, dim, fixed=True):
        opt.step({"e": RowGrad(idx, vals)})
        ref.grad = _dense(rows, dim, idx, vals)
        ref_opt.step()
    torch.testing.assert_close(table, ref.data, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["adagrad", "adam"])
def test_full_table_steps_equal_dense_torch_optim(name: str) -> None:
    """Steps touching every row (1-vs-all) take the in-place path; rows given as a shuffled
    permutation, or as a subset, take the gather/scatter path; all equal torch.optim."""
    rows, dim = 10, 3
    g = torch.Generator().manual_seed(5)
    init = torch.randn(rows, dim, dtype=torch.float64)
    table = init.clone()
    ref = torch.nn.Parameter(init.clone())
    if name == "adagrad":
        opt: RowAdagrad | RowAdam = RowAdagrad({"e": table}, lr=0.3, eps=1e-10)
        ref_opt: torch.optim.Optimizer = torch.optim.Adagrad([ref], lr=0.3, eps=1e-10)
    else:
        opt = RowAdam({"e": table}, lr=0.01, betas=(0.9, 0.99), eps=1e-8)
        ref_opt = torch.optim.Adam([ref], lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    orders = [torch.arange(rows), torch.randperm(rows, generator=g), torch.arange(rows)]
    if name == "adagrad":  # a subset step is lazy in Adam, so only Adagrad equals dense there
        orders.append(torch.tensor([2, 3, 8]))
    orders.append(torch.arange(rows))
    for idx in orders:
        vals = torch.randn(idx.numel(), dim, generator=g, dtype=torch.float64)
        before = table.data_ptr()
        opt.step({"e": RowGrad(idx, vals)})
        assert table.data_ptr() == before  # the table is updated in place, never replaced
        ref.grad = _dense(rows, dim, idx, vals)
        ref_opt.step()
    torch.testing.assert_close(table, ref.data, rtol=1e-12, atol=1e-12)


def test_adam_is_lazy_untouched_rows_and_state_never_change() -> None:
    rows, dim = 10, 3
    table = torch.randn(rows, dim, dtype=torch.float64)
    opt = RowAdam({"e": table}, lr=0.01)
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
    m = torch.zeros(rows, dim, dtype=torch.float64)
    v = torch.zeros(rows, dim, dtype=torch.float64)
    ref = table.clone()
    for step, (idx, vals) in enumerate(_steps(2, 10, rows, dim, fixed=False), 1):
        before, m_before = table.clone(), opt.exp_avg["e"].clone()
        opt.step({"e": RowGrad(idx, vals)})
        untouched = torch.ones(rows, dtype=torch.bool)
        untouched[idx] = False
        assert torch.equal(table[untouched], before[untouched])
        assert torch.equal(opt.exp_avg["e"][untouched], m_before[untouched])
        for i, row in enumerate(idx.tolist()):  # per-row reference of the lazy Adam update
            m[row] = b1 * m[row] + (1 - b1) * vals[i]
            v[row] = b2 * v[row] + (1 - b2) * vals[i] ** 2
            mhat = m[row] / (1 - b1**step)
            denom = v[row].sqrt() / math.sqrt(1 - b2**step) + eps
            ref[row] = ref[row] - lr * mhat / denom * (1 - b1**step) / (1 - b1**step)
    torch.testing.assert_close(table, ref, rtol=1e-10, atol=1e-12)


def test_state_dict_round_trip() -> None:
    table = torch.randn(5, 2)
    opt = RowAdam({"e": table}, lr=0.1)
    opt.step({"e": RowGrad(torch.tensor([0, 3]), torch.ones(2, 2))})
    other = RowAdam({"e": table.clone()}, lr=0.1)
    other.load_state_dict(opt.state_dict())
    assert other.step_count == 1
    state, loaded = opt.state_dict(), other.state_dict()
    assert set(loaded) == set(state) and len(state) > 2  # both moments and the step count
    assert all(
        torch.equal(torch.as_tensor(loaded[k]), torch.as_tensor(v)) for k, v in state.items()
    )


def test_lr_schedule() -> None:
    kw = {"base": 1.0, "warmup_steps": 4, "total_steps": 14}
    assert [lr_at(s, schedule="constant", **kw) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_at(9, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(14, schedule="linear", **kw) == pytest.approx(0.0)
    assert lr_at(9, schedule="linear", **kw) == pytest.approx(0.5)


def test_plateau_lr_follows_the_validation_history() -> None:
    """Hand-replayed: patience 1 and a 0.1 % relative threshold cut the rate after the second
    validation in a row that is not 0.1 % above the best so far."""
    scores = [0.30, 0.31, 0.3101, 0.309, 0.32, 0.32, 0.32]
    kw = {"factor": 0.5, "patience": 1, "threshold": 1e-3}
    rates = [plateau_lr(1.0, scores[:n], **kw) for n in range(len(scores) + 1)]
    assert rates == [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    assert plateau_lr(1.0, scores, min_lr=0.4, **kw) == 0.4
    assert plateau_lr(0.2, [0.1] * 4, factor=0.1, patience=0, threshold=0.0) == pytest.approx(
        0.2 * 0.1**3
    )
