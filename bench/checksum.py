"""What a checkpoint's checksum costs: hash throughput, and a commit and its verification.

    git worktree add /work/wt-before <commit with SHA-256 checksums>
    .venv/bin/python bench/checksum.py --before /work/wt-before --rounds 3 \
        --out bench/results/checksum.json

``hash``: MB/s of SHA-256, BLAKE2b and XXH3-128 over one 256 MiB buffer in memory (median of
``--rounds``). ``commit``: a TransE-like state with Adam (entity table and its two moments,
``--rows`` x ``--dim`` float32 each, plus a small relation table) committed to a local folder with
``CheckpointStore.save`` and then verified the way a resume verifies it
(``CheckpointStore.verify``: every file re-read and hashed), by this checkout and by the
``--before`` checkout, each in its own process, the variants interleaved round by round;
medians.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from common import commit, hardware, write_result  # noqa: E402

# run in a child process with PYTHONPATH set to the checkout under test
_COMMIT = """
import json, sys, tempfile, time, torch
from kgpipe.checkpoint import CheckpointStore, TrainState
from kgpipe.storage import Store
rows, dim, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
g = torch.Generator().manual_seed(0)
ent, rel = torch.randn(rows, dim, generator=g), torch.randn(1000, dim, generator=g)
state = TrainState(1, 100, {"entity": ent, "relation": rel},
    {"entity.exp_avg": ent.clone(), "entity.exp_avg_sq": ent.abs(),
     "relation.exp_avg": rel.clone(), "relation.exp_avg_sq": rel.abs(),
     "step": torch.tensor([100])}, [], torch.get_rng_state())
with tempfile.TemporaryDirectory(dir=root) as tmp:
    ckpts = CheckpointStore(Store(tmp))
    t0 = time.perf_counter(); ckpt = ckpts.save(state, {}); t1 = time.perf_counter()
    ok = ckpts.verify(ckpt); t2 = time.perf_counter()
    print(json.dumps({"save_s": t1 - t0, "verify_s": t2 - t1, "ok": ok,
                      "files": ckpt.manifest["files"]}))
"""


def bench_hash(rounds: int) -> dict[str, float]:
    import xxhash

    data = os.urandom(256 << 20)
    algos: dict[str, Any] = {
        "sha256": hashlib.sha256,
        "blake2b": hashlib.blake2b,
        "xxh3_128": xxhash.xxh3_128,
    }
    out = {}
    for name, new in algos.items():
        seconds = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            new(data).digest()
            seconds.append(time.perf_counter() - t0)
        out[f"{name}_mb_per_s"] = len(data) / statistics.median(seconds) / 1e6
    return out


def _commit_once(checkout: Path, rows: int, dim: int, root: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    run = subprocess.run(
        [sys.executable, "-c", _COMMIT, str(rows), str(dim), root],
        capture_output=True, text=True, env=env, check=True, cwd=checkout,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ok"], result
    return result


def _checksum_names(run: dict[str, Any]) -> list[str]:
    """The checksums a variant's manifest names (its first file's entry)."""
    return sorted(set(next(iter(run["files"].values()))) - {"bytes"})


def _times(run: dict[str, Any]) -> dict[str, float]:
    return {"save_s": run["save_s"], "verify_s": run["verify_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--before", type=Path, required=True, help="a checkout to compare with")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--root", default=str(REPO.parent), help="where the checkpoints are written")
    p.add_argument("--out", default="checksum.json", help="file name under bench/results/")
    args = p.parse_args()
    variants = {"before": args.before.resolve(), "after": REPO}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory(dir=args.root, prefix="kgpipe-checksum-") as root:
        for r in range(args.rounds):
            for name, checkout in variants.items():
                res = _commit_once(checkout, args.rows, args.dim, root)
                runs[name].append(res)
                print(f"round {r} {name}: save {res['save_s']:.2f} s, verify "
                      f"{res['verify_s']:.2f} s", file=sys.stderr)  # fmt: skip
    medians = {
        name: {k: statistics.median(x[k] for x in rows) for k in ("save_s", "verify_s")}
        for name, rows in runs.items()
    }
    size = sum(int(f["bytes"]) for f in runs["after"][0]["files"].values())
    result = {
        "benchmark": "checksum",
        "commit": commit(),
        "hardware": hardware(),
        "command": " ".join(sys.argv),
        "bytes": size,
        "checksums": {n: _checksum_names(rows[0]) for n, rows in runs.items()},
        "hash": bench_hash(args.rounds),
        "rounds": {n: [_times(x) for x in rows] for n, rows in runs.items()},
        "medians": medians,
        "save_ratio_before_vs_after": medians["before"]["save_s"] / medians["after"]["save_s"],
        "verify_ratio_before_vs_after": medians["before"]["verify_s"]
        / medians["after"]["verify_s"],
    }
    write_result(result, REPO / "bench" / "results" / args.out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
