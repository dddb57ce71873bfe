"""The search: the sweep driver, its pipeline, recorder and confirmation, the
Optuna searches and the worker pools."""
from pathlib import Path

# The directory that holds the tunefw package: what a process the sweep starts (Ray workers,
# the sampler host) needs on PYTHONPATH to import tunefw. Not tunefw/ itself: there, tunefw's
# own `cuda` package would shadow NVIDIA's `cuda.bindings`.
IMPORT_ROOT = str(Path(__file__).resolve().parents[2])
