"""Staging's peak memory and time, code before against after: reading the splits into ids
(``load_dataset``: the columnar reader, deduplication), writing the vocabulary and writing the
shuffled training shards (``stage_shards``), as a run's staging does, in a fresh process per
code tree and round.

Generates a synthetic TSV graph once (``kgpipe synth``, kept in ``--graph``), then reports per
tree: the seconds of each phase, the lines read per second, the process's peak resident set
(``VmHWM``) after reading and at the end, and a digest of the shards and vocabulary written
(the trees must write the same bytes). ``--budget 512MiB`` adds a run of each tree with
``data.memory_budget`` set (its ids spilled to the temp folder). ``--parquet`` reads the
graph's files as Parquet (written once next to them, columns ``head, relation, tail``),
``--zstd`` compressed with Zstandard (written once next to them, ``*.tsv.zst``), ``--csv`` as
CSV files with a header row ``head,relation,tail`` (written once next to them, read with
``data.header: true``), ``--wide-csv`` as CSV files of five columns ``id,head,weight,relation,
tail`` read with ``data.columns: [head, relation, tail]``, ``--quoted-csv`` as CSV files with every
field quoted (R's ``write.csv``), ``--ntriples`` as N-Triples
(``<http://kg.example/e/LABEL>`` IRIs; every tenth statement more with a literal object, dropped,
or kept as an entity with ``--keep-literals``).

    git worktree add /tmp/kgpipe-before REV
    .venv/bin/python bench/staging_memory.py --edges 10000000 --entities 2000000 \\
        --before /tmp/kgpipe-before --rounds 2 --budget 512MiB
Results: bench/results/staging_memory_<edges>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import code_trees, commit, hardware, interleaved_rounds, synth_graph, write_result

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import hashlib, json, sys, tempfile, time
tree, _, budget = sys.argv[1].partition("::")
sys.path.insert(0, tree)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
from kgpipe.config import DataConfig
from kgpipe.data.dataset import load_dataset
from kgpipe.data.shards import stage_shards
from kgpipe.storage import Store
graph, name = sys.argv[2], sys.argv[4]
start = status("VmRSS")
extra = {"memory_budget": budget} if budget else {}
if name.endswith(".wide.csv"):
    extra["columns"] = ("head", "relation", "tail")
if name.endswith(".nt"):
    extra["literals"] = sys.argv[5]
cfg = DataConfig(**{split: graph + "/" + name.format(split) for split in ("train", "valid", "test")},
                 header=name.endswith(".csv"), **extra)
t0 = time.perf_counter()
data = load_dataset(cfg)
read_s = time.perf_counter() - t0
read_peak = status("VmHWM")
lines = sum(r.lines for r in data.reports.values())
with tempfile.TemporaryDirectory(dir=sys.argv[3]) as tmp:
    t0 = time.perf_counter()
    data.vocab.write(tmp + "/vocab")
    vocab_s = time.perf_counter() - t0
    vocab_peak = status("VmHWM")
    t0 = time.perf_counter()
    manifest = stage_shards(data.train, Store(tmp), num_shards=16, seed=0)
    stage_s = time.perf_counter() - t0
    sums = [hashlib.sha256(open(tmp + "/vocab/" + f, "rb").read()).hexdigest()
            for f in ("entities.tsv", "relations.tsv")]
digest = hashlib.sha256("".join([*manifest.sha256, *sums]).encode()).hexdigest()
print(json.dumps({"read_seconds": read_s, "vocab_seconds": vocab_s, "vocab_peak": vocab_peak,
                  "stage_seconds": stage_s, "lines": lines, "budget": budget or None,
                  "lines_per_s": lines / read_s, "start_rss": start,
                  "read_peak": read_peak, "peak": status("VmHWM"),
                  "train_triples": int(data.train.shape[0]), "entities": data.num_entities,
                  "fingerprint": data.fingerprint, "shards_digest": digest}))
"""


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--entities", type=int, default=2_000_000)
    p.add_argument("--relations", type=int, default=100)
    p.add_argument("--before", help="a checkout of the code before")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--graph", default=None, help="keep the graph here (reused when it exists)")
    p.add_argument("--budget", help="also run each tree with data.memory_budget so set")
    p.add_argument("--budget-only", action="store_true", help="only the runs with --budget")
    p.add_argument("--zstd", action="store_true", help="read the files compressed (.tsv.zst)")
    p.add_argument("--parquet", action="store_true", help="read the files as Parquet")
    p.add_argument("--csv", action="store_true", help="read the files as CSV with a header row")
    p.add_argument("--wide-csv", action="store_true", help="CSV of five columns, data.columns")
    p.add_argument("--quoted-csv", action="store_true", help="CSV, every field quoted (R's)")
    p.add_argument("--ntriples", action="store_true", help="read the files as N-Triples")
    p.add_argument("--keep-literals", action="store_true", help="N-Triples: data.literals keep")
    p.add_argument("--json")
    args = p.parse_args()
    if args.budget_only and not args.budget:
        p.error("--budget-only needs --budget")
    if args.keep_literals and not args.ntriples:
        p.error("--keep-literals needs --ntriples")
    graph = Path(args.graph or f"/tmp/kgpipe-staging-{args.edges}")
    synth_graph(graph, entities=args.entities, relations=args.relations, edges=args.edges)
    if args.zstd:
        _compress(graph)
    if args.parquet:
        _to_parquet(graph)
    if args.csv or args.wide_csv or args.quoted_csv:
        _to_csv(graph, wide=args.wide_csv, quoted=args.quoted_csv)
    if args.ntriples:
        _to_ntriples(graph)
    trees = code_trees(args.before, ROOT)
    if args.budget:  # each tree again with the budget (the code before may have one too)
        budgeted = {f"{k}, memory_budget {args.budget}": f"{v}::{args.budget}"
                    for k, v in trees.items()}  # fmt: skip
        trees = budgeted if args.budget_only else {**trees, **budgeted}
    with tempfile.TemporaryDirectory() as tmp:
        name = ("{}.parquet" if args.parquet else "{}.csv" if args.csv
                else "{}.wide.csv" if args.wide_csv else "{}.quoted.csv" if args.quoted_csv
                else "{}.nt" if args.ntriples
                else "{}.tsv.zst" if args.zstd else "{}.tsv")  # fmt: skip
        literals = "keep" if args.keep_literals else "drop"
        runs = interleaved_rounds(
            CHILD, trees, args.rounds, [str(graph), tmp, name, literals], cwd=tmp
        )
    keys = ("read_seconds", "vocab_seconds", "stage_seconds", "lines_per_s", "read_peak",
            "vocab_peak", "peak")  # fmt: skip
    out: dict[str, Any] = {
        "hardware": hardware(),
        "commit": commit(),
        "command": " ".join(sys.argv),
        "graph_bytes": sum(f.stat().st_size for f in graph.glob(name.format("*"))),
        "same_result": len({(r["fingerprint"], r["shards_digest"]) for rs in runs.values()
                            for r in rs}) == 1,
        "median": {name: {k: statistics.median(r[k] for r in rows) for k in keys}
                   for name, rows in runs.items()},
        "runs": runs,
    }  # fmt: skip
    print(json.dumps(out["median"], indent=1), "same result:", out["same_result"])
    kind = ("_parquet" if args.parquet else "_csv" if args.csv else "_wide_csv" if args.wide_csv
            else "_quoted_csv" if args.quoted_csv
            else "_nt_keep" if args.keep_literals else "_nt" if args.ntriples else "_zstd" if args.zstd else "")  # fmt: skip
    name = f"staging_memory_{args.edges}{kind}.json"
    write_result(out, Path(args.json or RESULTS / name))


def _to_parquet(graph: Path) -> None:
    """Each split's ``.parquet`` (columns head, relation, tail) next to its ``.tsv``."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    names = ["head", "relation", "tail"]
    for split in ("train", "valid", "test"):
        target = graph / f"{split}.parquet"
        if not target.exists():
            table = pcsv.read_csv(
                graph / f"{split}.tsv",
                read_options=pcsv.ReadOptions(column_names=names),
                parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
                convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string())),
            )
            pq.write_table(table, target)


def _to_csv(graph: Path, *, wide: bool = False, quoted: bool = False) -> None:
    """Each split's ``.csv`` (a header row, then the ``.tsv``'s lines with commas) next to it;
    ``wide``: ``.wide.csv``, each row with a running id and a weight around its triple;
    ``quoted``: ``.quoted.csv``, every field quoted (as R's ``write.csv`` writes)."""
    for split in ("train", "valid", "test"):
        target = graph / f"{split}.{'wide.' if wide else 'quoted.' if quoted else ''}csv"
        if target.exists():
            continue
        with open(graph / f"{split}.tsv", "rb") as src, open(target, "wb") as dst:
            if quoted:
                dst.write(b'"head","relation","tail"\n')
                for line in src:
                    dst.write(b'"%s"\n' % line.rstrip(b"\n").replace(b"\t", b'","'))
                continue
            dst.write(b"id,head,weight,relation,tail\n" if wide else b"head,relation,tail\n")
            row = 0
            for line in src:
                assert b"," not in line and b'"' not in line
                if wide:
                    h, r, t = line.rstrip(b"\n").split(b"\t")
                    line = b"%d,%s,%d.5,%s,%s\n" % (row, h, row % 10, r, t)
                    row += 1
                dst.write(line.replace(b"\t", b","))


def _to_ntriples(graph: Path) -> None:
    """Each split's ``.nt`` next to its ``.tsv``: a statement per triple, and after every tenth
    one a statement of its head with a literal object (dropped when read)."""
    for split in ("train", "valid", "test"):
        target = graph / f"{split}.nt"
        if target.exists():
            continue
        with open(graph / f"{split}.tsv", "rb") as src, open(target, "wb") as dst:
            for row, line in enumerate(src):
                h, r, t = line.rstrip(b"\n").split(b"\t")
                e = b"<http://kg.example/e/"
                dst.write(b"%s%s> <http://kg.example/r/%s> %s%s> .\n" % (e, h, r, e, t))
                if row % 10 == 0:
                    dst.write(b'%s%s> <http://kg.example/name> "%s"@en .\n' % (e, h, h))


def _compress(graph: Path) -> None:
    """Each split's ``.tsv.zst`` next to its ``.tsv`` (kept when it is there already)."""
    import zstandard

    for split in ("train", "valid", "test"):
        target = graph / f"{split}.tsv.zst"
        if not target.exists():
            with open(graph / f"{split}.tsv", "rb") as src, open(target, "wb") as dst:
                zstandard.ZstdCompressor().copy_stream(src, dst)


if __name__ == "__main__":
    main()
