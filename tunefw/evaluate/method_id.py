"""The timing method's name, part of every trial's device fingerprint, in a module without torch:
the simulated and replay workers, and the CLI, name the method without importing torch (seconds
per process). evaluate/method.py times by this name and takes it from here."""
from __future__ import annotations

# 2: graph timings cycle over operand copies past L2 (evaluate/cuda.py); 3: the flush reads
# (leaves no dirty lines) and kernels under 0.1 ms are timed as graphs
# (benchmarks/results/timing_method_h200.json); 4: whether a kernel is timed as graphs is read
# off three paired probe launches (a small kernel's single-launch screen, thrown away, was most
# of a decode trial's GPU time), and a screen whose cuBLAS anchor ran 1.5x slower than the
# problem's earlier anchors on the worker (a disturbed GPU) is taken again
METHOD = "anchored-4"
