"""The CUDA driver layer shared by the evaluator, the runtime and the benchmark scripts."""
