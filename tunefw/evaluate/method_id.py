"""The timing method's name, part of every trial's device fingerprint, in a module without torch:
the simulated and replay workers, and the CLI, name the method without importing torch (seconds
per process). evaluate/method.py times by this name; tests/test_launch_start.py holds the two equal."""
from __future__ import annotations

METHOD = "anchored-2"  # 2: graph timings cycle over operand copies past L2 (evaluate/cuda.py)
