"""Measuring tuned kernels on a GPU: tunefw bench (against cuBLAS and Triton) and
tunefw verify."""
