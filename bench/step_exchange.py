"""One step-sync gang of 2 workers on the speed workload (FB15k-237 TransE, 3 epochs,
``exchange: auto``); prints the label, the median epoch seconds of epochs 2-3 and the median
comm seconds. Run from /tmp with PYTHONPATH pointing at the tree to measure, interleaving trees:

    for r in 1 2 3; do for t in before after; do PYTHONPATH=/tmp/wt-$t \
        .venv/bin/python bench/step_exchange.py $t; done; done
"""

import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from kgpipe.config import load_config
from kgpipe.pipeline import train

if __name__ == "__main__":
    root = tempfile.mkdtemp(prefix="stepbench-")
    cfg = load_config(
        str(Path(__file__).parent / "configs/fb15k237-transe-speed.yaml"),
        overrides=[
            "training.epochs=3",
            "evaluation.every=0",
            "evaluation.test=false",
            f"run.root={root}",
            "run.name=s",
            f"data.root={Path(__file__).parents[2] / 'shared/datasets'}",
            "distributed.workers=2",
            "distributed.sync=step",
            "distributed.exchange=auto",
            "training.threads=1",
        ],
    )
    try:
        train(cfg)
        metrics = (Path(root) / "s/metrics.jsonl").read_text()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [json.loads(x) for x in metrics.splitlines()]
    print(
        sys.argv[1],
        statistics.median(r["seconds"] for r in rows[1:]),
        statistics.median(r.get("comm_seconds", 0) for r in rows[1:]),
    )
