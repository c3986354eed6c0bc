#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one prepared command (nothing here runs in CI):
#   bash bench/gpu_check.sh            # from the checkout root, on a machine with a GPU
# 1. the GPU tests (GPU against CPU training, fp32 and bf16; the dask-cuda rank);
# 2. a LocalCUDACluster + NCCL gang of one worker training the UMLS demo config, and one of the
#    sharded strategy (FB15k-237 TransE, 3 epochs);
# 3. training speed (TransE and ComplEx, bench/speed.py: on the GPU at batch 1024 and 8192, and on
#    the host's CPU cores as this machine's baseline) and full filtered evaluation speed
#    (bench/eval_speed.py) on the GPU;
# 4. torch.profiler over 20 training steps at batch 1024 (bench/gpu_profile.py);
# 5. per-query candidate ranks on the GPU at several batch and pair-group sizes (bench/gpu_candidates.py).
# Results: bench/results/gpu_*.json and gpu_device.txt ($OUT/gpu_results.tgz too when $OUT is
# set). Each step has its own time limit; the script exits non-zero if any step failed.
# Without a GPU it says so and exits 0. Python: $PYTHON, else .venv/bin/python, else python3.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3); fi
fi
export PYTHONUNBUFFERED=1
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA GPU visible to torch here ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA build:", torch.version.cuda)' 2>/dev/null || echo 'torch not importable')); nothing to check"
    exit 0
fi
RESULTS=bench/results
DATA="${KGPIPE_DATA_ROOT:-../shared/datasets}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failed=()
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    local t0=$SECONDS
    if timeout "$limit" "$@"; then
        echo "== $name: ok ($((SECONDS - t0)) s)"
    else
        echo "== $name: FAILED ($((SECONDS - t0)) s)"
        failed+=("$name")
    fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$TMP/gpu.txt"

step "GPU tests" 300 "$PY" -m pytest -q -p no:cacheprovider tests/test_devices.py

if "$PY" -c 'import dask_cuda' 2>/dev/null; then
    step "LocalCUDACluster + NCCL gang of one" 300 "$PY" -m kgpipe.cli train --no-prefect -q \
        -c configs/umls-complex.yaml --set distributed.cluster=cuda --set distributed.workers=1 \
        --set training.epochs=20 --set run.root="$TMP/runs" --set run.name=cuda-gang
    "$PY" - "$TMP/runs/cuda-gang" "$RESULTS/gpu_cuda_gang_umls.json" <<'PYEOF' || failed+=("gang record")
import json, sys
from pathlib import Path
run, out = Path(sys.argv[1]), Path(sys.argv[2])
results = json.loads((run / "results.json").read_text())
metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
manifest = json.loads(sorted((run / "checkpoints").glob("*/manifest.json"))[-1].read_text())
record = {"test_mrr": results["mrr"], "epochs": len(metrics),
          "triples_per_s": [m["triples_per_s"] for m in metrics],
          "world_size": manifest["world_size"], "sync": manifest["sync"]}
out.write_text(json.dumps(record, indent=2) + "\n")
print(record)
PYEOF
    # the sharded strategy on NCCL (all_to_all_single of the rows and gradients; a gang of one,
    # since two ranks may not share this GPU), 3 epochs of FB15k-237 TransE, then the test split
    step "LocalCUDACluster + NCCL sharded gang of one" 300 "$PY" -m kgpipe.cli train --no-prefect \
        -q -c configs/fb15k237-transe.yaml --set data.root="$DATA" --set distributed.cluster=cuda \
        --set distributed.workers=1 --set distributed.strategy=sharded --set training.epochs=3 \
        --set evaluation.every=0 --set run.root="$TMP/runs" --set run.name=cuda-sharded
    "$PY" - "$TMP/runs/cuda-sharded" "$RESULTS/gpu_cuda_sharded_fb15k237.json" <<'PYEOF' || failed+=("sharded record")
import json, sys
from pathlib import Path
run, out = Path(sys.argv[1]), Path(sys.argv[2])
results = json.loads((run / "results.json").read_text())
metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
record = {"test_mrr": results["mrr"], "epochs": len(metrics),
          "triples_per_s": [m["triples_per_s"] for m in metrics],
          "layout": json.loads((run / "embeddings" / "model.json").read_text()).get("layout")}
out.write_text(json.dumps(record, indent=2) + "\n")
print(record)
PYEOF
else
    echo "== LocalCUDACluster + NCCL gang: FAILED (dask-cuda is not installed: pip install '.[gpu]')"
    failed+=("LocalCUDACluster gang")
fi

for model in transe complex; do
    step "training speed $model" 300 "$PY" bench/speed.py --no-pykeen --device cuda \
        --model "$model" --data "$DATA/fb15k-237" --json "$RESULTS/gpu_speed_${model}_fb15k237.json"
    # the same steps on the host's CPU cores (the baseline on this machine), and batches 8x larger
    step "training speed $model, host CPU" 120 "$PY" bench/speed.py --no-pykeen --device cpu \
        --model "$model" --data "$DATA/fb15k-237" --json "$RESULTS/gpu_host_cpu_speed_${model}_fb15k237.json"
    step "training speed $model, batch 8192" 120 "$PY" bench/speed.py --no-pykeen --device cuda \
        --model "$model" --batch-size 8192 --steps 25 --data "$DATA/fb15k-237" \
        --json "$RESULTS/gpu_speed_${model}_b8192_fb15k237.json"
done
step "profile of a batch-1024 step" 120 bash -c '"$0" bench/gpu_profile.py "$1" >"$2"' \
    "$PY" "$DATA" "$RESULTS/gpu_profile_step.txt"
step "per-query candidates: ranks independent of batch and pair-group size" 300 \
    "$PY" bench/gpu_candidates.py --json "$RESULTS/gpu_candidates.json"
step "evaluation speed" 300 "$PY" bench/eval_speed.py --device cuda --data-root "$DATA" \
    --models distmult,complex,transe-l2 --json "$RESULTS/gpu_eval_speed_fb15k237.json"

cp "$TMP/gpu.txt" "$RESULTS/gpu_device.txt"
if [ -n "${OUT:-}" ]; then  # one archive of the results (the device tool brings back few files)
    # the files only: `ls gpu_*` would also list the contents of earlier runs' gpu_* folders
    tar czf "$OUT/gpu_results.tgz" -C "$RESULTS" $(cd "$RESULTS" && find . -maxdepth 1 -type f -name 'gpu_*' | sort)
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: failed: ${failed[*]}"
    exit 1
fi
echo "gpu_check: all steps passed"
