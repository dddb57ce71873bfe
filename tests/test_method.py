"""The measurement method's pure parts: verdicts, statistics, launch counts, failure classes."""
import itertools
import math

import pytest
import torch

from tunefw.evaluate import method
from tunefw.outcome import Status


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


class _FakeGpu:
    """A stream on a CPU: launches advance a clock by their cost, events read it, every launch
    and flush is logged in order; ``drift`` scales each cost by a slowly falling clock."""

    def __init__(self, monkeypatch, drift: float = 0.0) -> None:
        self.now, self.log, self.drift = 0.0, [], drift
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = None

            def record(self) -> None:
                self.t = gpu.now

            def elapsed_time(self, end) -> float:
                return end.t - self.t

        monkeypatch.setattr(torch.cuda, "Event", Event)

    def launch(self, name: str, ms: float):
        def run() -> None:
            self.log.append(name)
            self.now += ms * (1.0 + self.drift * len(self.log))
        return run

    def flush(self) -> None:
        self.log.append("flush")
        self.now += 0.03

    def graph(self, launch, repeats: int):
        """method.capture_graph's stand-in: a replay runs the launch ``repeats`` times."""
        launches = launch if isinstance(launch, list) else [launch]

        def replay() -> None:
            for i in range(repeats):
                launches[i % len(launches)]()
        return replay


@pytest.mark.parametrize("kernel_ms, anchor_ms", [(0.2, 0.25), (0.25, 0.2), (6.0, 5.0),
                                                  (10.0, 0.01), (0.01, 10.0)])
def test_anchored_screen_interleaves_kernel_and_anchor(monkeypatch, kernel_ms, anchor_ms):
    gpu = _FakeGpu(monkeypatch)
    kernel, anchor = method.anchored_screen(gpu.launch("A", kernel_ms), gpu.launch("B", anchor_ms),
                                            gpu.flush, lambda: None)
    launches = gpu.log[1::2]
    assert gpu.log[0::2] == ["flush"] * len(launches)  # every launch right after a flush
    assert launches == ["A", "B"] * (len(launches) // 2)  # A B A B ..., never two in a row
    assert (kernel.median_ms, anchor.median_ms) == (pytest.approx(kernel_ms), pytest.approx(anchor_ms))
    assert kernel.samples == anchor.samples >= method.SCREEN_LAUNCHES
    slower = max(kernel_ms, anchor_ms)  # the slower side meets the screen's time ...
    assert kernel.samples * slower >= method.ANCHORED_SCREEN_MIN_MS
    # ... and sizes it: a slow kernel is not run until its fast anchor has had 40 ms
    assert kernel.samples <= max(method.SCREEN_LAUNCHES,
                                 math.ceil(method.ANCHORED_SCREEN_MIN_MS / slower) + 1)
    warm_pairs = len(launches) // 2 - kernel.samples  # launched but not in the timings
    assert warm_pairs >= method.WARMUP_LAUNCHES
    assert warm_pairs * (kernel_ms + anchor_ms) >= method.ANCHORED_WARMUP_MIN_MS
    if kernel_ms + anchor_ms < 1:  # fast kernels: sized by time, not far past it
        assert warm_pairs * (kernel_ms + anchor_ms) < method.ANCHORED_WARMUP_MIN_MS + 1


def test_a_drifting_clock_moves_the_times_not_their_ratio(monkeypatch):
    gpu = _FakeGpu(monkeypatch, drift=2e-4)  # every launch a little slower than the last
    kernel, anchor = method.anchored_screen(gpu.launch("A", 0.2), gpu.launch("B", 0.25),
                                            gpu.flush, lambda: None)
    assert kernel.median_ms > 0.2 * 1.02  # the raw time drifted by several percent ...
    assert kernel.median_ms / anchor.median_ms == pytest.approx(0.8, rel=2e-3)  # ... not the ratio


@pytest.mark.parametrize("ms", [0.2, 0.03])  # a screen; a graph (under GRAPH_BELOW_MS)
def test_bench_times_each_path_beside_cublas_on_one_clock(monkeypatch, ms):
    from tunefw.measure.bench import time_paths
    gpu = _FakeGpu(monkeypatch, drift=2e-4)
    monkeypatch.setattr(method, "capture_graph", gpu.graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    paths = {"tunefw": gpu.launch("A", ms), "triton": gpu.launch("T", 1.25 * ms)}
    timings = time_paths(paths, gpu.launch("B", ms), gpu.flush)
    runs = [name for name, _ in itertools.groupby(x for x in gpu.log if x != "flush")]  # a graph: one
    pairs = list(zip(runs[0::2], runs[1::2]))
    assert set(pairs) == {("A", "B"), ("T", "B")}  # every launch of a path followed by cuBLAS's
    mine, beside = timings["tunefw"]
    theirs, beside_theirs = timings["triton"]
    assert mine.median_ms / beside.median_ms == pytest.approx(1.0, rel=2e-3)  # drift cancels
    assert theirs.median_ms / beside_theirs.median_ms == pytest.approx(1.25, rel=2e-3)
    assert (mine.launches_per_sample > 1) == (ms < method.GRAPH_BELOW_MS)


def test_confirmation_keeps_three_warm_up_pairs_then_its_own_minimums(monkeypatch):
    gpu = _FakeGpu(monkeypatch)
    kernel, _ = method.interleaved(gpu.launch("A", 0.2), gpu.launch("B", 0.25), gpu.flush,
                                   lambda: None, min_launches=100, min_ms=300.0)
    assert gpu.log.count("A") - kernel.samples == method.WARMUP_LAUNCHES
    assert kernel.samples * 0.25 >= 300.0  # the slower side's time


def test_plain_screen_times_the_launch_alone(monkeypatch):
    gpu = _FakeGpu(monkeypatch)
    timing = method.screen(gpu.launch("A", 0.2), gpu.flush, lambda: None)
    assert gpu.log == ["flush", "A"] * (len(gpu.log) // 2)
    warm = gpu.log.count("A") - timing.samples
    assert warm * 0.2 >= method.WARMUP_MIN_MS and timing.samples * 0.2 >= method.SCREEN_MIN_MS


def test_anchored_graph_samples_are_per_launch(monkeypatch):
    gpu = _FakeGpu(monkeypatch)
    kernel, anchor = method.anchored_screen(gpu.launch("A", 0.4), gpu.launch("B", 0.5),
                                            gpu.flush, lambda: None, launches_per_sample=40)
    assert (kernel.median_ms, anchor.median_ms) == (pytest.approx(0.01), pytest.approx(0.0125))
    assert kernel.launches_per_sample == anchor.launches_per_sample == 40


@pytest.mark.parametrize("kernel_ms, cublas_ms, confirm", [
    (0.2, 0.25, None), (0.006, 0.004, None), (0.2, 0.25, (100, 300.0)), (0.006, 0.004, (100, 300.0))])
def test_the_cuda_evaluator_times_every_trial_beside_cublas(monkeypatch, kernel_ms, cublas_ms,
                                                            confirm):
    from tunefw.evaluate.cuda import CudaEvaluator
    gpu = _FakeGpu(monkeypatch)
    monkeypatch.setattr(method, "capture_graph", gpu.graph)
    evaluator = object.__new__(CudaEvaluator)  # no GPU here: only its timing path runs
    evaluator._flush, evaluator._anchors = gpu.flush, method.AnchorWatch()
    timing, cublas, note = evaluator._time(gpu.launch("A", kernel_ms), gpu.launch("B", cublas_ms),
                                           lambda: None, confirm)
    assert (timing.median_ms, cublas.median_ms) == (pytest.approx(kernel_ms), pytest.approx(cublas_ms))
    runs = [name for name in gpu.log if name != "flush"]
    per_sample = method.graph_repeats(kernel_ms) if kernel_ms < method.GRAPH_BELOW_MS else 1
    assert timing.launches_per_sample == cublas.launches_per_sample == per_sample
    # the last screen (or the confirmation) ran kernel and cuBLAS samples in turn, per_sample each
    timed = runs[-2 * per_sample * timing.samples:]
    assert timed == (["A"] * per_sample + ["B"] * per_sample) * timing.samples
    assert timing.samples * per_sample * max(kernel_ms, cublas_ms) >= (
        confirm[1] if confirm else method.ANCHORED_SCREEN_MIN_MS)
    unit = "launches" if per_sample == 1 else f"CUDA graphs of {per_sample} launches"
    how = "confirmed over" if confirm else "screened"
    assert note == f"{how} {timing.samples} {unit} interleaved with cuBLAS"
    # single launches (each alone after a flush): a small kernel's are its three probe pairs
    # only (no single-launch screen before its graphs), a large kernel's its whole screen too
    singles = [gpu.log[i] for i in range(1, len(gpu.log)) if gpu.log[i - 1] == "flush"
               and (i + 1 == len(gpu.log) or gpu.log[i + 1] == "flush")]
    assert (len(singles) == 2 * method.WARMUP_LAUNCHES) == (per_sample > 1)
    assert singles[:2 * method.WARMUP_LAUNCHES] == ["A", "B"] * method.WARMUP_LAUNCHES


def test_a_screen_whose_cublas_anchor_ran_slow_is_taken_again(monkeypatch):
    """A disturbed GPU: the second trial's first screen finds cuBLAS 4x slower than the first
    trial's did, so it is screened again and keeps the second screen; a third trial at the usual
    speed is screened once; another problem has its own fastest anchor."""
    from tunefw.evaluate.cuda import CudaEvaluator
    screens = []
    anchors = iter([0.25, 1.0, 0.26, 0.27, 2.0])

    def screen(kernel, anchor, flush, wait, *, launches_per_sample=1):
        screens.append(launches_per_sample)
        return method.summarize([0.2] * 10), method.summarize([next(anchors)] * 10)

    monkeypatch.setattr(method, "anchored_screen", screen)
    monkeypatch.setattr(method, "time_each", lambda launches, flush, wait: [0.2] * len(launches))
    evaluator = object.__new__(CudaEvaluator)
    evaluator._flush, evaluator._anchors = None, method.AnchorWatch()
    noop = lambda: None  # noqa: E731
    notes = []
    for key in ("p", "p", "p", "q"):
        timing, cublas, note = evaluator._time(noop, noop, noop, None, key=key)
        notes.append((cublas.median_ms, note))
    assert notes == [
        (0.25, "screened 10 launches interleaved with cuBLAS"),
        (0.26, "screened 10 launches interleaved with cuBLAS; screened again: cuBLAS had run "
               "4.0x its fastest on this problem (a disturbed GPU)"),
        (0.27, "screened 10 launches interleaved with cuBLAS"),
        (2.0, "screened 10 launches interleaved with cuBLAS")]  # q: its first anchor
    assert screens == [1] * 5


def test_graphs_hold_enough_launches():
    assert method.graph_repeats(0.005) == 40
    assert method.graph_repeats(1.0) == 2


def test_cuda_failures_become_outcomes():
    from cuda.bindings import driver as cu
    from tunefw.cuda.driver import CudaFailure, classify
    E = cu.CUresult
    assert classify(CudaFailure(E.CUDA_ERROR_ILLEGAL_ADDRESS, "run", "k")) == (Status.RUNTIME_CRASH, True)
    assert classify(CudaFailure(E.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "launch", "k")) == (
        Status.OUT_OF_RESOURCES, False)
    assert classify(CudaFailure(E.CUDA_ERROR_NO_BINARY_FOR_GPU, "load", "k")) == (
        Status.COMPILE_ERROR, False)
    # the same resource code while the kernel runs means a poisoned context, not a rejection
    assert classify(CudaFailure(E.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "run", "k"))[1] is True


def test_graphs_cycle_over_operand_copies_past_l2():
    l2 = 60 * 2**20
    assert method.rotation_copies(2 * 4096 * 4096, l2) == 6  # a 32 MB weight: 6 sets, 192 MB
    assert method.rotation_copies(2 * 28672 * 4096, l2) == 1  # 235 MB never stays in L2
    assert method.rotation_copies(16, l2) == method.ROTATE_MAX_COPIES



def test_a_captured_graph_cycles_over_its_launches(monkeypatch):
    import contextlib

    class Graph:
        def replay(self) -> None:
            pass
    monkeypatch.setattr(method.torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(method.torch.cuda, "graph", lambda g: contextlib.nullcontext())
    captured: list[int] = []
    method.capture_graph([lambda i=i: captured.append(i) for i in range(3)], 7)
    assert captured == [0, 1, 2, 0, 1, 2, 0]  # launch i of the graph reads operand set i mod 3
    method.capture_graph(lambda: captured.append(9), 2)
    assert captured[-2:] == [9, 9]
