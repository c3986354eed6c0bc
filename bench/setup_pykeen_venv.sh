#!/usr/bin/env bash
# Create (or update) the separate benchmark venv `.venv-bench` holding PyKEEN.
# PyKEEN is a peer for side-by-side measurement only and is kept out of kgpipe's
# own dependencies. torch is pinned to the local CPU wheel through the repo's
# constraints file; an unpinned torch would pull several GB of CUDA packages.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

VENV=".venv-bench"
if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi

"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first (pinned), then the rest under the same constraints so no resolver
# step can replace it with a CUDA build.
"$VENV/bin/python" -m pip install --quiet -c constraints.txt "torch==2.13.0" numpy
"$VENV/bin/python" -m pip install --quiet -c constraints.txt "torch==2.13.0" numpy pykeen

# Fail loudly if a CUDA build or CUDA runtime packages slipped in.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sys

import torch

bad = sorted(d.metadata["Name"] for d in md.distributions()
             if d.metadata["Name"] and d.metadata["Name"].lower().startswith(("nvidia-", "triton")))
if torch.__version__.split("+")[0] != "2.13.0" or torch.version.cuda is not None or bad:
    sys.exit(f"unexpected torch install: torch={torch.__version__} cuda={torch.version.cuda} extra={bad}")
import pykeen
print(f"ok: torch {torch.__version__}, pykeen {pykeen.get_version()}", file=sys.stderr)
PY
