"""The first-call guard: a non-exact route (or a thin exact win) is timed against cuBLAS before
it is trusted.

The first eager call of a shape that a bucket, nearest or neighbour-calibrated rule serves, that
calibration left unproven (evidence on one side of its M only: cuBLAS until measured), or whose
own entry beat cuBLAS by less than THIN_RATIO when it was confirmed, times the rule's kernel and
cuBLAS interleaved on the call's own operands (L2 flushed, about 3 ms of GPU time: see
cuda_timer) and keeps the faster. The decision is remembered for the
process and in a small persistent cache (JSON) keyed by the table's hash, the GPU's fingerprint
and the shape, so a changed table or another GPU never reuses it. Under CUDA-graph capture or
torch.compile tracing nothing is timed: a stored decision is used if there is one, else the
table's rule (an unproven route stays cuBLAS).

Off with ``Dispatcher(..., guard=False)`` or ``TUNEFW_GUARD=0`` (unproven routes then stay
cuBLAS); the cache file is ``$TUNEFW_CACHE_DIR/guard.json`` (default
``~/.cache/tunefw/guard.json``) unless ``guard_cache=PATH`` (``False``: process memory only).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tunefw.device import DeviceSpec
from tunefw.runtime.dispatch import DispatchTable
from tunefw.runtime.env import switch

# (kernel launch, cuBLAS launch) -> (kernel ms, cuBLAS ms), estimated from interleaved launches
Timer = Callable[[Callable[[], object], Callable[[], object]], tuple[float, float]]
CACHE_FORMAT = 1
MAX_DECISIONS = 100000
ENV = "TUNEFW_GUARD"
MAX_PAIRS = 10
GUARDED = ("bucket", "nearest", "calibrated", "unproven")  # the paths the guard times
# An exact entry confirmed below this ratio to cuBLAS is timed too: a win of a few percent is
# within the spread of cuBLAS's own time between runs (the H200 served llama3_8b's exact decode
# entries confirmed at 1.016-1.035x at 0.968-1.002x in another run, dispatch_guard_h200.json;
# none confirmed at 1.05x or more fell below 1.0).
THIN_RATIO = 1.05


@dataclass(frozen=True)
class Decision:
    """A guard's verdict for one shape: keep the kernel or use cuBLAS, and the measured ratio."""

    kernel: bool
    ratio: float
    kernel_ms: float
    cublas_ms: float


def table_hash(table: DispatchTable) -> str:
    """A hash of everything in the table that decides a route."""
    text = json.dumps(table.as_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def gpu_key(gpu: DeviceSpec) -> str:
    """The GPU's fingerprint as a key: model, compute capability and limits."""
    return hashlib.sha256(json.dumps(gpu.as_dict(), sort_keys=True).encode()).hexdigest()[:20]


def enabled_by_env() -> bool:
    """False when $TUNEFW_GUARD turns the guard off (0, false, no, off)."""
    return switch(ENV)


def default_cache_path() -> Path:
    """$TUNEFW_CACHE_DIR/guard.json, default ~/.cache/tunefw/guard.json."""
    from tunefw.cuda.compiler import cache_root

    return cache_root(None) / "guard.json"


def capturing() -> bool:
    """Whether timing is forbidden now: CUDA-graph capture or torch.compile tracing."""
    import torch

    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if compiling is not None and compiling():
        return True
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


class DecisionCache:
    """Decisions by (table hash, GPU key, shape key), in memory and in a JSON file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._data: dict[str, dict] | None = None

    @staticmethod
    def key(table: str, gpu: str, shape: str) -> str:
        """The cache key of one shape's decision for one table on one GPU."""
        return f"{table}/{gpu}/{shape}"

    def _load(self) -> dict[str, dict]:
        if self._data is None:
            self._data = {}
            if self.path is not None:
                try:
                    raw = json.loads(self.path.read_text())
                    if isinstance(raw, dict) and raw.get("format") == CACHE_FORMAT \
                            and isinstance(raw.get("decisions"), dict):
                        self._data = raw["decisions"]
                except (OSError, ValueError, RecursionError):
                    pass  # a missing or broken cache is an empty one
        return self._data

    def get(self, key: str) -> Decision | None:
        """The stored decision, or None (also for a malformed record)."""
        with self._lock:
            raw = self._load().get(key)
        try:
            return Decision(bool(raw["kernel"]), float(raw["ratio"]), float(raw["kernel_ms"]),
                            float(raw["cublas_ms"])) if isinstance(raw, dict) else None
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str, decision: Decision) -> None:
        """Remember a decision, and write the file whole (a failed write keeps it in memory)."""
        with self._lock:
            data = self._load()
            if len(data) >= MAX_DECISIONS:
                data.clear()
            data[key] = {"kernel": decision.kernel, "ratio": decision.ratio,
                         "kernel_ms": decision.kernel_ms, "cublas_ms": decision.cublas_ms}
            if self.path is None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"format": CACHE_FORMAT, "decisions": data}))
                tmp.replace(self.path)
            except OSError:
                pass  # an unwritable cache only costs a re-measurement next process


def decide(timer: Timer, kernel: Callable[[], object], cublas: Callable[[], object],
           min_ratio: float = 1.0) -> Decision:
    """Time both on the same operands; keep the kernel only if its ratio reaches ``min_ratio``."""
    kernel_ms, cublas_ms = timer(kernel, cublas)
    ratio = cublas_ms / kernel_ms if kernel_ms > 0 else 0.0
    return Decision(ratio >= min_ratio, ratio, kernel_ms, cublas_ms)


# What a decision costs beyond its GPU time (events, syncs, the flush's launches): the H200 took
# 3.12 ms for 4097x14336x4096, two pairs of 1.30 ms plus flushes (dispatch_guard_hf_llama3_8b_h200.json).
HOST_MS = 0.5


def more_pairs(first_pair_ms: float, budget_ms: float, most: int = MAX_PAIRS) -> int:
    """(kernel, cuBLAS) pairs to time after the first: as many as fit in what is left of
    ``budget_ms`` (possibly none), ``most`` pairs in all at most."""
    left = budget_ms - first_pair_ms
    if left <= 0:
        return 0
    return min(most - 1, int(left / max(first_pair_ms, 1e-3) + 1e-9))


def cuda_timer(l2_bytes: int, budget_ms: float = 3.0) -> Timer:
    """Interleaved CUDA-event timing (L2 flushed before each launch) in about ``budget_ms``,
    flushes and ``HOST_MS`` of host work included: one timed pair, then more_pairs() pairs (a
    pair longer than the budget costs that one pair). Each side's estimate is the minimum over
    its 1-10 samples: with so few, a median still holds a freshly loaded kernel's first launch
    or a launch disturbed by other work, and the minimum discards both, on both sides alike.
    The flush buffer is allocated, and the flush timed, once, when the timer is made."""
    import torch

    from tunefw.evaluate import method

    flush = method.L2Flush(l2_bytes)
    flush_ms = min(method.time_each([flush, flush], None, torch.cuda.synchronize))

    def timer(kernel: Callable[[], object], cublas: Callable[[], object]) -> tuple[float, float]:
        times = method.time_each([kernel, cublas], flush, torch.cuda.synchronize)
        more = more_pairs(sum(times) + 2 * flush_ms, budget_ms - HOST_MS)
        if more:
            times += method.time_each([kernel, cublas] * more, flush, torch.cuda.synchronize)
        return min(times[0::2]), min(times[1::2])

    return timer


class Guard:
    """A Dispatcher's guard: stored decisions, first-call timing, capture-time notes."""

    def __init__(self, table: DispatchTable, enabled: bool | None = None, timer: Timer | None = None,
                 cache: str | Path | bool | None = None) -> None:
        self.table, self.timer = table, timer
        self.enabled = enabled_by_env() if enabled is None else bool(enabled)
        path = None if cache is False else Path(cache) if cache not in (None, True) else default_cache_path()
        self.cache = DecisionCache(path)
        self.hash = table_hash(table)
        self.untimed: dict[str, str] = {}  # shape key -> why it was not timed
        self._timers: dict[int, Timer] = {}  # CUDA device index -> its cuda_timer

    def _device_timer(self, gpu: DeviceSpec) -> Timer:
        """The current device's timer, made once (its L2 flush buffer is allocated once)."""
        import torch

        index = torch.cuda.current_device()
        if index not in self._timers:
            self._timers[index] = cuda_timer(gpu.l2_bytes)
        return self._timers[index]

    def applies(self, route, problem) -> bool:
        """Whether the route needs the guard: an exact entry confirmed below THIN_RATIO, or a
        non-exact rule's kernel (serving, or unproven and cuBLAS until measured) with no
        measurement of this very shape."""
        from tunefw.runtime.rules import evidence_for

        if not self.enabled or route.donor is None:
            return False
        if route.path == "exact":  # a thin win: measured again on this GPU before it is trusted
            return route.ratio is not None and route.ratio < THIN_RATIO
        if route.path not in GUARDED:
            return False
        points = evidence_for(self.table, route.donor, problem)
        return not (len(points) == 1 and points[0].M == problem.M)

    def _key(self, problem, gpu: DeviceSpec) -> str:
        return DecisionCache.key(self.hash, gpu_key(gpu), problem.key())

    def stored(self, route, problem, gpu: DeviceSpec):
        """The route with a stored decision applied (unchanged when there is none)."""
        if not self.applies(route, problem):
            return route
        decision = self.cache.get(self._key(problem, gpu))
        return route if decision is None else self._route(route, decision)

    def can_time(self, route, problem) -> bool:
        """Whether the route is to be timed now: the guard applies and nothing is being captured
        or traced (a shape first seen there is noted for explain())."""
        if not self.applies(route, problem):
            return False
        if capturing():
            self.untimed[problem.key()] = ("first seen during CUDA-graph capture or torch.compile "
                                           "tracing: the table's rule, not timed")
            return False
        return True

    def first_call(self, route, problem, gpu: DeviceSpec, kernel: Callable[[], object],
                   cublas: Callable[[], object]):
        """Time the route's kernel against cuBLAS (unless capturing) and return the decided route."""
        if not self.can_time(route, problem):
            return route
        decision = decide(self.timer or self._device_timer(gpu), kernel, cublas,
                          self.table.evidence_min_ratio)
        self.untimed.pop(problem.key(), None)  # first seen in a capture, timed eagerly now
        self.cache.put(self._key(problem, gpu), decision)
        return self._route(route, decision)

    @staticmethod
    def _route(route, decision: Decision):
        from dataclasses import replace

        from tunefw.runtime.rules import Route, shape

        what = f"the {route.rule} entry {shape(route.donor)}"
        measured = f"first-call guard measured {decision.ratio:.3f}x cuBLAS on this shape"
        if decision.kernel:
            return replace(route, path="guarded", entry=route.donor, ratio=decision.ratio,
                           reason=f"{measured}: kept {what}; {route.reason}")
        return Route("cublas", None, f"{measured} for {what}: cuBLAS is faster", route.rule,
                     route.donor, decision.ratio)
