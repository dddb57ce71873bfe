"""The correctness method shared by every evaluator (design.md: 'Timing and correctness').

A result passes only if it has no NaN/Inf (the output is NaN-poisoned before the run, so an
unwritten element fails here), and its relative Frobenius error against a float32 reference is
under the dtype bound and under 4x the error of cuBLAS on the same inputs, globally and per row.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from tunefw.evaluate import method_id

DTYPE_BOUND = {"bf16": 2e-2, "fp16": 2e-2}
UNIT_ROUNDOFF = {"bf16": 2.0**-9, "fp16": 2.0**-12}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
CUBLAS_FACTOR = 4.0


@dataclass
class Verdict:
    ok: bool
    rel_err: float
    reason: str = ""


def make_inputs(M: int, N: int, K: int, dtype: str, seed: int, device: str = "cpu"):
    """Random normal operands (never zeros: they hide unwritten outputs and wrong indexing)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(M, K, generator=gen, device=device, dtype=torch.float32).to(TORCH_DTYPE[dtype])
    b = torch.randn(N, K, generator=gen, device=device, dtype=torch.float32).to(TORCH_DTYPE[dtype])
    return a, b


def reference(a: torch.Tensor, b: torch.Tensor, gate: str = "none") -> torch.Tensor:
    """float32 reference C = A B^T; gate "silu": silu(A Bg^T) * (A Bu^T) for B = [Bg; Bu]."""
    c = a.float() @ b.float().T
    if gate == "none":
        return c
    g, u = c.chunk(2, dim=1)
    return torch.nn.functional.silu(g) * u


def stock(a: torch.Tensor, b: torch.Tensor, gate: str, out: torch.Tensor) -> None:
    """What runs without tunefw, into ``out``: cuBLAS's A B^T; gated, one cuBLAS GEMM over
    [Bg; Bu] then SiLU and the product as torch runs them (Llama's MLP, its two projections
    fused: the fastest stock form). The baseline every gated result is judged and timed by."""
    if gate == "none":
        torch.mm(a, b.t(), out=out)
        return
    g, u = torch.mm(a, b.t()).chunk(2, dim=1)
    torch.mul(torch.nn.functional.silu(g), u, out=out)


def row_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    diff = (out.float() - ref).norm(dim=1)
    return diff / ref.norm(dim=1).clamp_min(1e-30)


def frobenius_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def verify(out: torch.Tensor, ref: torch.Tensor, dtype: str,
           baseline: torch.Tensor | None = None) -> Verdict:
    """Judge a kernel's output against the float32 reference and (if given) cuBLAS's output."""
    if out.shape != ref.shape:
        return Verdict(False, float("inf"), f"output shape {tuple(out.shape)} != {tuple(ref.shape)}")
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        r, c = (int(x) for x in bad[0])
        return Verdict(False, float("inf"),
                       f"{bad.shape[0]} non-finite elements (unwritten or NaN), first at ({r}, {c})")
    bound = DTYPE_BOUND[dtype]
    floor = UNIT_ROUNDOFF[dtype]
    err = frobenius_error(out, ref)
    base_err = frobenius_error(baseline, ref) if baseline is not None else 0.0
    limit = min(bound, CUBLAS_FACTOR * max(base_err, floor)) if baseline is not None else bound
    if err > limit:
        return Verdict(False, err, f"relative error {err:.3e} > limit {limit:.3e} "
                                   f"(dtype bound {bound:g}, cuBLAS {base_err:.3e})")
    rows = row_errors(out, ref)
    row_limit = torch.full_like(rows, bound)
    if baseline is not None:
        row_limit = torch.minimum(row_limit, CUBLAS_FACTOR * row_errors(baseline, ref).clamp_min(floor))
    over = rows > row_limit
    if bool(over.any()):
        r = int(over.nonzero()[0])
        return Verdict(False, err, f"{int(over.sum())} rows over their limit, first row {r}: "
                                   f"{float(rows[r]):.3e} > {float(row_limit[r]):.3e}")
    return Verdict(True, err)


# ---- timing (screening, confirmation, graphs) ----------------------------------------------
# A launch is any callable that enqueues one GEMM on the current stream; `wait` blocks until the
# stream is idle (evaluators pass one that enforces the trial deadline). Events bracket each
# launch alone; the L2 flush runs before every launch, outside the timed region.
#
# design.md's floors are >= 3 warm-up launches and >= 10 timed ones (>= 10 ms). On the H200 the
# SM clock drifts with power and temperature over seconds, not only at the 700 W cap, so a
# kernel's raw time does not repeat: five 30 ms screens of one 4096^3 config spread 2.0-2.2%;
# with 100 ms screens the first of five, right after another config's, ran 1.6% fast (the clock
# that config left behind); five back-to-back screens of one mma_sm80 config at 4096^3
# (360 TFLOP/s, 510-650 W) ran 0.381, 0.385, 0.389, 0.390, 0.411 ms while NVML read 1920, 1875,
# 1905, 1875, 1815 MHz (7.6% apart). With cuBLAS screened once per (problem, worker) and reused,
# a trial's ratio mixed two thermal states: the round-3 wgmma sweep's screens put the 4096^3
# winner at 1.07x cuBLAS, its 300 ms interleaved confirmation at 0.99x.
#
# So every search screen is anchored: the kernel and cuBLAS on the same inputs are timed
# interleaved (A B A B ..., each flushed), both under the same clock, and the search's objective
# is their ratio (Outcome.ratio). The ratio is what a screen measures reliably, and it compares
# across a fleet's GPUs, which raw TFLOP/s from different GPUs do not. A 4096^3 trial (~0.2 ms a
# launch each) costs >= 30 ms of paired warm-up + >= 40 ms of the slower side timed (with its
# partner), ~110 ms of GPU work: no more than the 60 + 80 ms the kernel alone took before (a
# sweep must keep >= 5 trials/s at 4096^3); a slow config costs less, not more. The plain screen (the launch alone, >= 60 ms warm-up + >= 80 ms) remains for
# `tunefw bench`.
WARMUP_LAUNCHES = 3
WARMUP_MIN_MS = 60.0
SCREEN_LAUNCHES = 10
SCREEN_MIN_MS = 80.0
ANCHORED_WARMUP_MIN_MS = 30.0  # kernel and anchor together
ANCHORED_SCREEN_MIN_MS = 40.0  # of the slower side
# The timing method's name, part of every trial's device fingerprint: a stored measurement is
# reused, and a study round resumed, only under the method that took it (a ratio to a cuBLAS
# screened once per worker is not the ratio to the cuBLAS interleaved with the screen).
METHOD = method_id.METHOD
MAX_LAUNCHES = 5000
# Kernels faster than this are also timed as a CUDA graph of back-to-back launches over operand
# copies: every decode GEMM (gate_up at M=1 runs ~57 us). Single launches of 20-70 us between
# events carry the host's launch path in cuBLAS's time (torch.mm's dispatch outlasts a short
# flush) and spread: two stream_sm90 configs of one shape screened 1.17x and 1.81x singly,
# 1.23x and 1.21x as graphs (timing_method_h200.json).
GRAPH_BELOW_MS = 0.100
GRAPH_MIN_MS = 0.2  # a graph holds enough launches to run at least this long


@dataclass
class Timing:
    """Per-launch times in ms (median, min, inter-quartile range) and how they were taken."""

    median_ms: float
    min_ms: float
    iqr_ms: float
    samples: int
    launches_per_sample: int = 1  # > 1: each sample was a CUDA graph of this many launches


def summarize(samples_ms: list[float], launches_per_sample: int = 1) -> Timing:
    """Median, min and IQR of per-launch times (graph samples divided by their launch count)."""
    xs = sorted(s / launches_per_sample for s in samples_ms)
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    return Timing(statistics.median(xs), xs[0], q3 - q1, len(xs), launches_per_sample)


class L2Flush:
    """Evicts the L2 between launches by reading a buffer twice its size.

    Reading, not writing: a flush that writes leaves the L2 full of dirty lines, and the timed
    launch after it pays their write-back (up to 60 MB on the H200, ~15 us of HBM time) on top
    of its own traffic; a served model's GEMM finds clean weight lines of the layers before it.
    """

    def __init__(self, l2_bytes: int, device: torch.device | str = "cuda") -> None:
        self.l2_bytes = l2_bytes
        self.buffer = torch.zeros(max(2 * l2_bytes, 2**20) // 8, dtype=torch.int64, device=device)
        self()  # its reduction kernel loads now (lazily loaded, the first flush cost ~10 ms)

    def __call__(self) -> None:
        self.buffer.max()


def launch_count(per_launch_ms: float, min_launches: int, min_ms: float) -> int:
    """Launches needed for at least ``min_launches`` and ``min_ms`` of kernel time."""
    wanted = math.ceil(min_ms / per_launch_ms) if per_launch_ms > 0 else MAX_LAUNCHES
    return max(min_launches, min(wanted, MAX_LAUNCHES))


def time_each(launches: list[Callable[[], None]], flush: Callable[[], None] | None,
              wait: Callable[[], None]) -> list[float]:
    """Run the launches in order, each alone between two CUDA events; their times in ms."""
    events = []
    for launch in launches:
        if flush:
            flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        events.append((start, end))
    wait()
    return [start.elapsed_time(end) for start, end in events]


def warm_up(launches: list[Callable[[], None]], flush: Callable[[], None] | None,
            wait: Callable[[], None], min_ms: float) -> list[float]:
    """Untimed-for-the-result rounds of the launches in turn (A B A B ... for two):
    WARMUP_LAUNCHES, then more until ``min_ms`` of their time has run; returns their times (ms),
    in launch order, for sizing the timed run."""
    warm = time_each(launches * WARMUP_LAUNCHES, flush, wait)
    left = min_ms - sum(warm)
    per_round = sum(min(warm[i::len(launches)]) for i in range(len(launches)))
    more = launch_count(per_round, 0, left) if left > 0 else 0
    return warm + (time_each(launches * more, flush, wait) if more else [])


def screen(launch: Callable[[], None], flush: Callable[[], None] | None, wait: Callable[[], None],
           *, min_launches: int = SCREEN_LAUNCHES, min_ms: float = SCREEN_MIN_MS,
           launches_per_sample: int = 1) -> Timing:
    """Warm up, then time enough launches for ``min_launches`` and ``min_ms`` (design.md)."""
    warm = warm_up([launch], flush, wait, WARMUP_MIN_MS)
    n = launch_count(min(warm), min_launches, min_ms)
    return summarize(time_each([launch] * n, flush, wait), launches_per_sample)


def interleaved(launch_a: Callable[[], None], launch_b: Callable[[], None],
                flush: Callable[[], None] | None, wait: Callable[[], None], *, min_launches: int,
                min_ms: float, warmup_ms: float = 0.0,
                launches_per_sample: int = 1) -> tuple[Timing, Timing]:
    """Warm up (>= ``warmup_ms`` of both), then time A B A B ... (each flushed) until both
    reach ``min_launches`` and the slower reaches ``min_ms``. (Both reaching ``min_ms`` would
    run a 10 ms kernel 4000 times beside a 0.01 ms cuBLAS: a fault kernel timed out that way.)"""
    warm = warm_up([launch_a, launch_b], flush, wait, warmup_ms)
    n = min(launch_count(min(warm[0::2]), min_launches, min_ms),
            launch_count(min(warm[1::2]), min_launches, min_ms))
    times = time_each([launch_a, launch_b] * n, flush, wait)
    return (summarize(times[0::2], launches_per_sample), summarize(times[1::2], launches_per_sample))


def anchored_screen(launch: Callable[[], None], anchor: Callable[[], None],
                    flush: Callable[[], None] | None, wait: Callable[[], None], *,
                    launches_per_sample: int = 1) -> tuple[Timing, Timing]:
    """A search screen: the kernel interleaved with its anchor (cuBLAS), so both run on the
    same clock and their ratio holds while the clock drifts; (kernel, anchor) timings."""
    return interleaved(launch, anchor, flush, wait, min_launches=SCREEN_LAUNCHES,
                       min_ms=ANCHORED_SCREEN_MIN_MS, warmup_ms=ANCHORED_WARMUP_MIN_MS,
                       launches_per_sample=launches_per_sample)


DISTURBED = 1.5  # an anchor this many times its problem's fastest on the worker: screen again


class AnchorWatch:
    """Each problem's fastest cuBLAS anchor so far on one worker (per-launch ms, keyed by the
    caller: problem and timing mode). The H200 once ran cuBLAS at 0.11-0.5x its usual rate for
    a stretch of 17 minutes (14 of 6047 recorded screens, benchmarks/results/
    state_figures_h200.json): both sides of those screens slowed,
    and their ratios, up to 1.07x where the shape's confirmed best is 0.82x, were no measure."""

    def __init__(self) -> None:
        self.fastest: dict = {}

    def slowdown(self, key, anchor_ms: float) -> float | None:
        """How many times its problem's fastest this anchor ran, where that is DISTURBED or more
        (the screen was taken on a disturbed GPU), else None; the anchor is remembered."""
        fastest = self.fastest.get(key)
        self.fastest[key] = anchor_ms if fastest is None else min(fastest, anchor_ms)
        if fastest is None or anchor_ms < DISTURBED * fastest:
            return None
        return anchor_ms / fastest


ROTATE_L2_FACTOR = 3.0  # operand copies a timing graph cycles over: bytes past each reuse / L2
ROTATE_MAX_COPIES = 64


def rotation_copies(bytes_per_copy: int, l2_bytes: int) -> int:
    """How many operand sets a timing graph cycles over so that a set is reused only after
    ROTATE_L2_FACTOR x L2 of other traffic: a decode GEMM's weight (32 MB at 1x4096x4096) fits
    the H200's L2, and back-to-back launches on one set would time L2, not HBM, where a served
    model reads each layer's weight after all the others."""
    return min(ROTATE_MAX_COPIES, max(1, math.ceil(ROTATE_L2_FACTOR * l2_bytes / max(bytes_per_copy, 1))))


def graph_repeats(per_launch_ms: float) -> int:
    """How many launches one timing graph holds (at least GRAPH_MIN_MS of work)."""
    return max(2, math.ceil(GRAPH_MIN_MS / max(per_launch_ms, 1e-4)))


def capture_graph(launch: Callable[[], None] | list[Callable[[], None]],
                  repeats: int) -> Callable[[], None]:
    """A CUDA graph of ``repeats`` back-to-back launches (cycling over a list of launches, e.g.
    the same GEMM on rotating operand copies); returns its replay function."""
    launches = launch if isinstance(launch, list) else [launch]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(repeats):
            launches[i % len(launches)]()
    return graph.replay
