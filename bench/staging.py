"""Staging speed and memory: the columnar reader against the line parser (issue 22, item 5).

Generates a synthetic TSV graph (``kgpipe synth``, kept in ``--graph``), then reads it with
``load_dataset`` in a fresh process per reader and round, and records the wall time, the lines
read per second and the process's peak resident memory (``ru_maxrss``), next to the bytes the
result must hold (the int64 ids of the triples). Rounds interleave the readers; medians.

    .venv/bin/python bench/staging.py --edges 10000000 --entities 2000000 --readers columnar lines
Results: bench/results/staging_<edges>.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import commit, hardware, synth_graph

RESULTS = Path(__file__).resolve().parent / "results"


def child(graph: Path, reader: str, block_size: str) -> None:
    """One staging in this process; prints its numbers as JSON."""
    import kgpipe.data.reading as reading
    from kgpipe.config import DataConfig
    from kgpipe.data.dataset import load_dataset

    if reader == "lines":
        reading._columnar_ok = lambda src, cfg: False  # type: ignore[assignment]
    cfg = DataConfig(
        train=str(graph / "train.tsv"),
        valid=str(graph / "valid.tsv"),
        test=str(graph / "test.tsv"),
        header=False,
        block_size=block_size,
    )
    t0 = time.perf_counter()
    data = load_dataset(cfg)
    seconds = time.perf_counter() - t0
    lines = sum(r.lines for r in data.reports.values())
    print(
        json.dumps(
            {
                "seconds": round(seconds, 2),
                "lines": lines,
                "lines_per_s": round(lines / seconds),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "entities": data.num_entities,
                "relations": data.num_relations,
                "train_triples": int(data.train.shape[0]),
                "ids_bytes": sum(int(t.numel()) * 8 for t in (data.train, data.valid, data.test)),
                "fingerprint": data.fingerprint,
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--entities", type=int, default=2_000_000)
    p.add_argument("--relations", type=int, default=100)
    p.add_argument("--readers", nargs="+", default=["columnar", "lines"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--block-size", default="64MiB")
    p.add_argument("--graph", default=None, help="keep the graph here (reused when it exists)")
    p.add_argument("--child", nargs=2, metavar=("GRAPH", "READER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(Path(args.child[0]), args.child[1], args.block_size)
        return
    graph = Path(args.graph or f"/tmp/kgpipe-staging-{args.edges}")
    t0 = time.perf_counter()
    synth_graph(graph, entities=args.entities, relations=args.relations, edges=args.edges)
    synth_s = time.perf_counter() - t0
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in args.readers}
    for _ in range(args.rounds):
        for reader in args.readers:
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(graph), reader,
                 "--block-size", args.block_size],
                capture_output=True, text=True,
            )  # fmt: skip
            if out.returncode:
                runs[reader].append({"failed": out.returncode, "stderr": out.stderr[-2000:]})
                print(reader, "failed", out.returncode, out.stderr[-500:], file=sys.stderr)
                continue
            runs[reader].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(reader, runs[reader][-1], file=sys.stderr)
    summary: dict[str, Any] = {}
    for reader, rs in runs.items():
        ok = [r for r in rs if "failed" not in r]
        if ok:
            summary[reader] = {
                "seconds": statistics.median(r["seconds"] for r in ok),
                "lines_per_s": statistics.median(r["lines_per_s"] for r in ok),
                "peak_rss_bytes": statistics.median(r["peak_rss_bytes"] for r in ok),
            }
    prints = {r[0]["fingerprint"] for r in runs.values() if r and "failed" not in r[0]}
    record = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "graph_bytes": sum(f.stat().st_size for f in graph.glob("*.tsv")),
        "synth_seconds": round(synth_s, 1),
        "same_result": len(prints) <= 1,
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"staging_{args.edges}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
