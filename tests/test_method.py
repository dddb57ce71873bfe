"""The measurement method's pure parts: verdicts, statistics, launch counts, failure classes."""
import pytest
import torch

from tunefw.evaluate import method
from tunefw.evaluate.outcome import Status


@pytest.fixture
def case():
    a, b = method.make_inputs(256, 48, 256, "bf16", seed=3)
    ref = method.reference(a, b)
    cublas = (a @ b.T)
    return ref, cublas


def test_inputs_are_random_normal_and_seeded():
    a1, _ = method.make_inputs(32, 16, 64, "bf16", seed=1)
    a2, _ = method.make_inputs(32, 16, 64, "bf16", seed=1)
    a3, _ = method.make_inputs(32, 16, 64, "bf16", seed=2)
    assert torch.equal(a1, a2) and not torch.equal(a1, a3)
    assert a1.dtype == torch.bfloat16 and float(a1.float().std()) == pytest.approx(1.0, abs=0.2)
    assert int((a1 == 0).sum()) < a1.numel() // 100  # never zeros


def test_a_correct_result_passes(case):
    ref, cublas = case
    verdict = method.verify(ref.to(torch.bfloat16), ref, "bf16", baseline=cublas)
    assert verdict.ok and verdict.rel_err < 4e-3


def test_one_unwritten_element_fails(case):
    ref, cublas = case
    out = ref.to(torch.bfloat16)
    out[5, 7] = float("nan")
    verdict = method.verify(out, ref, "bf16", baseline=cublas)
    assert not verdict.ok and "1 non-finite elements" in verdict.reason and "(5, 7)" in verdict.reason


def test_one_wrong_row_fails_where_the_global_norm_would_pass(case):
    ref, cublas = case
    out = ref.to(torch.bfloat16)
    out[11] *= 1.03
    assert method.frobenius_error(out, ref) < 4 * method.frobenius_error(cublas, ref)
    verdict = method.verify(out, ref, "bf16", baseline=cublas)
    assert not verdict.ok and "first row 11" in verdict.reason


def test_error_above_four_times_cublas_fails(case):
    ref, cublas = case
    noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0))
    out = (ref + noise * ref.std() * 0.01).to(torch.bfloat16)  # ~1e-2: under 2e-2, over 4x cuBLAS
    verdict = method.verify(out, ref, "bf16", baseline=cublas)
    assert not verdict.ok and "limit" in verdict.reason


def test_summary_statistics():
    t = method.summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (t.median_ms, t.min_ms, t.iqr_ms, t.samples) == (3.0, 1.0, 2.0, 5)
    g = method.summarize([20.0, 40.0], launches_per_sample=10)  # graph samples, per launch
    assert (g.median_ms, g.min_ms, g.launches_per_sample) == (3.0, 2.0, 10)


@pytest.mark.parametrize("per_launch_ms, expected", [(0.1, 100), (5.0, 10), (0.0, 5000)])
def test_launch_count_meets_both_minimums(per_launch_ms, expected):
    assert method.launch_count(per_launch_ms, min_launches=10, min_ms=10.0) == expected


def test_graphs_hold_enough_launches():
    assert method.graph_repeats(0.005) == 40
    assert method.graph_repeats(1.0) == 2


def test_cuda_failures_become_outcomes():
    from cuda.bindings import driver as cu
    from tunefw.evaluate.cuda import CudaFailure, classify
    E = cu.CUresult
    assert classify(CudaFailure(E.CUDA_ERROR_ILLEGAL_ADDRESS, "run", "k")) == (Status.RUNTIME_CRASH, True)
    assert classify(CudaFailure(E.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "launch", "k")) == (
        Status.OUT_OF_RESOURCES, False)
    assert classify(CudaFailure(E.CUDA_ERROR_NO_BINARY_FOR_GPU, "load", "k")) == (
        Status.COMPILE_ERROR, False)
    # the same resource code while the kernel runs means a poisoned context, not a rejection
    assert classify(CudaFailure(E.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "run", "k"))[1] is True
