"""The rank comparison on a score block: the plain ``>`` count (before NaN was counted
against the answer) against :func:`kgpipe.query_candidates.count_better`, on FB15k-237's
shape (a 512-query chunk against 14,541 entities, 50 masked columns), with the block's product
for scale. Medians of 7 rounds of 20 calls each, in ms per call.

    .venv/bin/python bench/count_better.py
"""

from __future__ import annotations

import statistics
import time

import torch

from kgpipe.query_candidates import count_better


def plain(block: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    return (block > true).sum(1)


def main() -> None:
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    block = torch.randn(512, 14541, generator=g)
    block[:, :50] = float("-inf")
    true = torch.randn(512, 1, generator=g)
    assert torch.equal(plain(block, true), count_better(block, true))  # no NaN: the same
    times: dict[str, list[float]] = {"plain >": [], "count_better": []}
    for _ in range(7):
        for name, fn in (("plain >", plain), ("count_better", count_better)):
            t0 = time.perf_counter()
            for _ in range(20):
                fn(block, true)
            times[name].append((time.perf_counter() - t0) / 20 * 1e3)
    queries, table = torch.randn(512, 200, generator=g), torch.randn(14541, 200, generator=g)
    product = []
    for _ in range(5):
        t0 = time.perf_counter()
        queries @ table.T
        product.append((time.perf_counter() - t0) * 1e3)
    for name, values in times.items():
        print(f"{name}: {statistics.median(values):.2f} ms")
    print(f"the block's product (d=200): {statistics.median(product):.2f} ms")


if __name__ == "__main__":
    main()
