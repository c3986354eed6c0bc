#!/usr/bin/env bash
# The first command a user runs, N times in a row (default 5): `make demo`'s command, each run
# checked for at most 120 lines of output, no traceback, exit 0, and the documented test MRR.
# Used by CI (.ci/run); prints one summary line per run and fails on the first bad one.
#   bash bench/demo_check.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-5}"
expected_mrr="0.9492"   # README / docs/benchmarks.md: test MRR of the demo on UMLS
tolerance="0.002"       # the thread count follows the machine's load; sums may reorder
max_lines=120
bin="${VENV:-.venv}/bin"
root="$(mktemp -d /tmp/kgpipe-demo-check.XXXXXX)"
trap 'rm -rf "$root"' EXIT
for i in $(seq 1 "$runs"); do
    log="$root/run-$i.log"
    start=$(date +%s)
    status=0
    "$bin/kgpipe" train -c configs/umls-complex.yaml --set distributed.workers=2 \
        --set "run.root=$root/runs" >"$log" 2>&1 </dev/null || status=$?
    lines=$(wc -l <"$log")
    mrr=$(sed -n 's/^│ both │ \([0-9.]*\) .*/\1/p' "$log" | head -n 1)
    echo "demo run $i/$runs: exit $status, $lines lines, test MRR ${mrr:-none}, $(($(date +%s) - start)) s"
    problem=""
    [ "$status" -eq 0 ] || problem+="; exit status $status"
    [ "$lines" -le "$max_lines" ] || problem+="; $lines lines of output (at most $max_lines)"
    ! grep -q "Traceback" "$log" || problem+="; a traceback in the output"
    [[ "$mrr" =~ ^[0-9]+\.[0-9]+$ ]] && awk -v m="$mrr" -v e="$expected_mrr" -v t="$tolerance" \
        'BEGIN { d = m - e; exit !(d <= t && -d <= t) }' ||
        problem+="; test MRR ${mrr:-missing}, expected $expected_mrr ± $tolerance"
    if [ -n "$problem" ]; then
        echo "demo run $i: ${problem#; }; its output:" >&2
        cat "$log" >&2
        exit 1
    fi
done
