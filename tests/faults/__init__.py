"""Fault kernels for tests and the GPU fault run (not shipped with tunefw)."""
