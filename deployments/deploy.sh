#!/usr/bin/env bash
# Create the process work pool and deploy every deployment of prefect.yaml, non-interactively
# (what `prefect work-pool create` and `prefect deploy --all` do by hand, from the checkout root).
# Needs PREFECT_API_URL pointing at a Prefect server (e.g. `prefect server start`).
#   PREFECT_API_URL=http://127.0.0.1:4200/api bash deployments/deploy.sh
# Then start a worker:  prefect worker start --pool kgpipe-process
set -euo pipefail
cd "$(dirname "$0")/.."
PREFECT="${PREFECT:-$(command -v prefect || echo .venv/bin/prefect)}"
: "${PREFECT_API_URL:?set PREFECT_API_URL to your Prefect server, e.g. http://127.0.0.1:4200/api}"
"$PREFECT" work-pool create kgpipe-process --type process --overwrite
"$PREFECT" --no-prompt deploy --all
