#!/usr/bin/env bash
# Issue 24's WN18RR acceptance: a search from a generic TransE config (not the shipped, tuned
# configs/wn18rr-transe.yaml, test MRR 0.220) with the shipped TransE space, 2 trials at a time
# on this machine's 2 cores, a time budget, then the best trial tested.
#   bash bench/tune_wn18rr.sh [BUDGET=60m] [STUDY_ROOT=/tmp/kgpipe-studies] [PRUNER=median] [SPACE] [SEED=0]
# SPACE: a search space file (default: the shipped TransE space), e.g.
# configs/tune/spaces/transe-cpu.yaml (the shipped space cut to a CPU budget); '' for the shipped.
# SEED: the study's seed (the sampler's, and each trial's from it).
# BUDGET is when the last trial may start; the running trials then finish (at most the 10-minute
# trial limit) and the best one is tested.
# Results: STUDY_ROOT/wn18rr-transe-generic-*/results.json, trials.csv, best.png (docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${1:-60m}"
root="${2:-/tmp/kgpipe-studies}"
pruner="${3:-median}"
space=()
if [ -n "${4:-}" ]; then space=(-s "$4"); fi
seed="${5:-0}"
exec .venv/bin/kgpipe tune -c configs/tune/wn18rr-transe-generic.yaml ${space[@]+"${space[@]}"} \
    --set data.root=../shared/datasets \
    --workers 2 --timeout "$budget" --trial-timeout 10m --seed "$seed" --pruner "$pruner" \
    --root "$root" --name "wn18rr-transe-generic-$(date -u +%Y%m%d-%H%M%S)"
