"""Per-query candidates (``evaluation.candidates``) on a GPU: do the ranks depend on how many
(query, candidate) pairs one call scores?

On the CPU a pair's score does not depend on the size of the call that scores it (tested in
tests/test_query_candidates.py, ties included), so any batch size, any pair-group size and a
sharded gang give the same ranks. A GPU library may reduce a small call another way. This
scores random FB15k-237-sized models (every interaction, both directions, with and without
50 distinct rows repeated over all entities, which makes exact ties) on the GPU at batch sizes
7 / 256 / 1000 and pair groups of 32,768 / 1,000 / 7,919, and compares the per-query ranks with
those of batch 256 / 32,768; and with the CPU's ranks of the same model (not expected to be
equal to the bit: another library).

    python bench/gpu_candidates.py [--json bench/results/gpu_candidates.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--triples", type=int, default=2000)
    p.add_argument("--k", type=int, default=500)
    args = p.parse_args()

    import torch

    import kgpipe.query_candidates as qcm
    from kgpipe.config import ModelConfig
    from kgpipe.evaluation import FilterIndex
    from kgpipe.models.model import KGEModel
    from kgpipe.query_candidates import QueryCandidates

    if not torch.cuda.is_available():
        print("gpu_candidates: no CUDA GPU; nothing to check")
        return
    ne, nr = 14_541, 237
    g = torch.Generator().manual_seed(0)

    def triples(n: int) -> torch.Tensor:
        return torch.stack(
            (
                torch.randint(0, ne, (n,), generator=g),
                torch.randint(0, nr, (n,), generator=g),
                torch.randint(0, ne, (n,), generator=g),
            ),
            1,
        )

    test, train = triples(args.triples), triples(50 * args.triples)
    index = FilterIndex.from_triples([train, test], nr)
    qc = QueryCandidates(args.k, split="test")

    def ranks(model: KGEModel, batch: int, pairs: int) -> torch.Tensor:
        qcm.PAIRS = pairs
        out = []
        for side in ("tail", "head"):
            for start in range(0, test.shape[0], batch):
                chunk = test[start : start + batch]
                targets = chunk[:, 2] if side == "tail" else chunk[:, 0]
                drawn = qc.draw(ne, side, targets, start)
                out.append(qcm.ranks(model, side, chunk, index, drawn).cpu())
        return torch.cat(out)

    rows = []
    ok = True
    for name in ("transe", "distmult", "complex", "rotate"):
        for reciprocal in (False, True):
            for ties in (False, True):
                model = KGEModel.build(
                    ModelConfig(name=name, dim=200, reciprocal=reciprocal),
                    num_entities=ne,
                    num_relations=nr,
                    seed=1,
                )
                if ties:  # 50 distinct rows: a candidate ties with the answer 1 time in 50
                    with torch.no_grad():
                        distinct = model.entity[:50].clone()
                        model.entity.copy_(distinct[torch.arange(ne) % 50])
                t0 = time.perf_counter()
                model.cuda()
                ref = ranks(model, 256, 1 << 15)
                diffs = {}
                for batch, pairs in ((7, 1 << 15), (1000, 1 << 15), (256, 1000), (256, 7919)):
                    got = ranks(model, batch, pairs)
                    diffs[f"batch {batch}, pairs {pairs}"] = int((got != ref).sum())
                cpu = ranks(model.cpu(), 256, 1 << 15)
                row = {
                    "model": name,
                    "reciprocal": reciprocal,
                    "ties": ties,
                    "half_ranks": int((ref != ref.floor()).sum()),
                    "queries": int(ref.numel()),
                    "ranks_differing_from_batch_256": diffs,
                    "ranks_differing_from_cpu": int((cpu != ref).sum()),
                    "max_rank_gap_to_cpu": float((cpu - ref).abs().max()),
                    "mrr_gpu": float((1 / ref).mean()),
                    "mrr_cpu": float((1 / cpu).mean()),
                    "seconds": round(time.perf_counter() - t0, 2),
                }
                ok &= all(v == 0 for v in diffs.values())
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print("gpu_candidates:", "ranks independent of batch and pair-group size" if ok else "DIFFER")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
