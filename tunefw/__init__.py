"""tunefw: a distributed autotuner for GPU GEMM kernels."""
__version__ = "0.1.0"
