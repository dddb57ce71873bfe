#!/usr/bin/env bash
# Install tunefw and run the quickstart study end to end: create, launch on 8 workers, export.
# Without a GPU the launch says so and uses the SIMULATED device; with one it tunes for real.
set -euo pipefail
cd "$(dirname "$0")/.."
# pip -q prints nothing while it works: say what is being installed and that it takes a while
python3 -c "import torch" 2>/dev/null || {
    echo "quickstart: installing PyTorch (CPU build; a few minutes on a fresh machine)"
    python3 -m pip install -q torch==2.13.0
}
echo "quickstart: installing tunefw and its dependencies (pip; minutes on a fresh machine)"
python3 -m pip install -q -e '.[dev]'
# The database is the default every tunefw command uses (tunefw.db here; TUNEFW_DB or --db
# to choose another), so the README's next commands see the quickstart study.
tunefw study show quickstart >/dev/null 2>&1 || tunefw study create quickstart --from studies/quickstart.yaml
tunefw launch quickstart --gpus "${GPUS:-8}"
tunefw study show quickstart
tunefw export dispatch.json --study quickstart
