"""The first-call guard on CPU with a fake timer: decisions, their cache keys, invalidation when
the table or the GPU changes, and what happens during CUDA-graph capture / tracing."""
import dataclasses
import json

import pytest
import torch

from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.runtime import guard
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, Evidence
from tunefw.runtime.dispatcher import Dispatcher
from tunefw.templates import FAMILIES

CONFIG = dict(FAMILIES["wgmma_sm90"].default_config(), CLUSTER_M=1)


def _table(tflops=700.0):
    entries = [DispatchEntry(M, 4096, 4096, "bf16", "TN", "wgmma_sm90", CONFIG, tflops, 650.0, M)
               for M in (128, 2048)]
    evidence = [Evidence(M, 4096, 4096, "bf16", "TN", "bucket", (2048, 4096, 4096), 110.0, 100.0)
                for M in (1000, 1600)]
    # M in 1000..1600 is calibrated where its 128x256 tiles are as full as at 1600 (1024: one
    # full wave of SMs), unproven elsewhere (129..999, 1601..2047, and e.g. 1500: two waves)
    return DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, entries, evidence=evidence)


class FakeTimer:
    def __init__(self, kernel_ms, cublas_ms):
        self.times, self.calls = (kernel_ms, cublas_ms), 0

    def __call__(self, kernel, cublas):
        self.calls += 1
        kernel(), cublas()  # both run on the call's operands
        return self.times


class FakePlan:
    def __init__(self, M, N, K):
        self.problem, self.ran, self.programmatic = GemmProblem(M, N, K), 0, []

    def __call__(self, a, b, lead=None, programmatic=True):
        self.ran += 1
        self.programmatic.append(programmatic)  # how each call asked to be launched
        return torch.matmul(a, b.t())

    def prepared(self, a, b):  # what the guard times: a plain launch on the call's operands
        return lambda: self(a, b, programmatic=False)


def _dispatcher(tmp_path, timer, table=None, gpu=H200, **kw):
    return Dispatcher(table or _table(), gpu=gpu, guard_timer=timer,
                      guard_cache=tmp_path / "guard.json", **kw)


def _first_call(d, M, N=4096, K=4096):
    """What gemm() does on a shape's first CUDA call, with a fake plan and CPU operands."""
    route = d.route(M, N, K, "bf16")
    plan = FakePlan(M, N, K)
    a, b = torch.randn(M, 64), torch.randn(N // 64, 64)
    return d._first_call(route, plan, a, b, d._devices[None]), plan


def test_the_guard_times_launches_whose_outputs_exist_before_its_timing(tmp_path):
    events = []

    class Prepared(FakePlan):
        def prepared(self, a, b):
            events.append("prepared")
            return super().prepared(a, b)

    def timer(kernel, cublas):
        events.append("timed")
        first, second = cublas(), cublas()  # cuBLAS writes into one C allocated before the timing
        assert first.data_ptr() == second.data_ptr() and first.shape == (1024, 4096)
        kernel()
        return 1.0, 2.0

    d = _dispatcher(tmp_path, timer)
    route = d.route(1024, 4096, 4096, "bf16")
    plan = Prepared(1024, 4096, 4096)
    a, b = torch.randn(1024, 64), torch.randn(4096, 64)
    assert d._first_call(route, plan, a, b, d._devices[None]) is plan
    assert events == ["prepared", "timed"] and plan.programmatic == [False]


def test_a_slower_kernel_is_replaced_by_cublas_and_remembered(tmp_path):
    timer = FakeTimer(kernel_ms=2.0, cublas_ms=1.0)
    d = _dispatcher(tmp_path, timer)
    assert d.route(1024, 4096, 4096, "bf16").path == "calibrated"  # between two measured Ms
    kept, plan = _first_call(d, 1024)
    assert kept is None and plan.ran == 1 and timer.calls == 1
    assert plan.programmatic == [False]  # timed as the sweeps time: a plain launch after a flush
    route = d.route(1024, 4096, 4096, "bf16")
    assert (route.path, route.rule, route.ratio) == ("cublas", "bucket", 0.5)
    assert d.explain(1024, 4096, 4096) == (
        "1024x4096x4096 bf16: cublas: first-call guard measured 0.500x cuBLAS on this shape for "
        "the bucket entry 2048x4096x4096: cuBLAS is faster")
    # a new process with the same table and GPU reads the decision: no timing
    again = _dispatcher(tmp_path, FakeTimer(1.0, 2.0))
    assert again.route(1024, 4096, 4096, "bf16").path == "cublas"
    saved = json.loads((tmp_path / "guard.json").read_text())
    (key,) = saved["decisions"]
    assert key == f"{guard.table_hash(_table())}/{guard.gpu_key(H200)}/1024x4096x4096:bf16:TN"


def test_a_faster_kernel_is_kept(tmp_path):
    d = _dispatcher(tmp_path, FakeTimer(kernel_ms=1.0, cublas_ms=1.25))
    kept, _ = _first_call(d, 100)
    assert kept is not None
    route = d.route(100, 4096, 4096, "bf16")
    assert (route.path, route.entry.M, route.ratio) == ("guarded", 128, 1.25)
    assert d.explain(100, 4096, 4096).startswith(
        "100x4096x4096 bf16: guarded: first-call guard measured 1.250x cuBLAS on this shape: kept "
        "the bucket entry 128x4096x4096; entry 128x4096x4096, the smallest tuned M above 100")


def test_decisions_are_invalidated_when_the_table_or_the_gpu_changes(tmp_path):
    _first_call(_dispatcher(tmp_path, FakeTimer(2.0, 1.0)), 1024)
    changed = _table(tflops=710.0)
    assert guard.table_hash(changed) != guard.table_hash(_table())
    assert _dispatcher(tmp_path, None, table=changed).route(1024, 4096, 4096, "bf16").path == "calibrated"
    other_gpu = dataclasses.replace(H200, sm_count=114)  # same model name and cc, other limits
    assert guard.gpu_key(other_gpu) != guard.gpu_key(H200)
    assert _dispatcher(tmp_path, None, gpu=other_gpu).route(1024, 4096, 4096, "bf16").path == "calibrated"
    assert _dispatcher(tmp_path, None).route(1024, 4096, 4096, "bf16").path == "cublas"


def test_nothing_is_timed_during_capture_or_tracing(tmp_path, monkeypatch):
    _first_call(_dispatcher(tmp_path, FakeTimer(2.0, 1.0)), 1024)  # stored before capture
    monkeypatch.setattr(guard, "capturing", lambda: True)
    timer = FakeTimer(2.0, 1.0)
    d = _dispatcher(tmp_path, timer)
    kept, plan = _first_call(d, 1010)  # first seen during capture: the table's rule
    assert kept is not None and timer.calls == 0 and plan.ran == 0
    assert d.route(1010, 4096, 4096, "bf16").path == "calibrated"
    assert d.explain(1010, 4096, 4096).endswith(
        "[guard: first seen during CUDA-graph capture or torch.compile tracing: the table's rule, not timed]")
    assert d.route(1024, 4096, 4096, "bf16").path == "cublas"  # the stored decision still holds


def test_exact_entries_measured_shapes_and_a_disabled_guard_are_not_timed(tmp_path, monkeypatch):
    timer = FakeTimer(2.0, 1.0)
    d = _dispatcher(tmp_path, timer)
    for M in (2048, 1000):  # an exact entry; a shape measured by calibration (1.1x)
        assert d.route(M, 4096, 4096, "bf16").path in ("exact", "calibrated")
        kept, _ = _first_call(d, M)
        assert kept is not None
    assert timer.calls == 0
    off = _dispatcher(tmp_path, timer, guard=False)
    kept, _ = _first_call(off, 1024)
    assert kept is not None and timer.calls == 0
    monkeypatch.setenv(guard.ENV, "0")
    assert not _dispatcher(tmp_path, timer)._guard.enabled


def _thin_table():
    """The test table with its M=2048 entry confirmed at 660 / 650 = 1.015x cuBLAS."""
    table = _table()
    entries = [dataclasses.replace(e, tflops=660.0) if e.M == 2048 else e for e in table.entries]
    return dataclasses.replace(table, entries=entries)


def test_a_thin_exact_win_is_timed_before_it_is_trusted(tmp_path, monkeypatch):
    assert guard.THIN_RATIO > 660.0 / 650.0 and 700.0 / 650.0 > guard.THIN_RATIO
    slower = FakeTimer(kernel_ms=2.0, cublas_ms=1.9)
    d = _dispatcher(tmp_path, slower, table=_thin_table())
    assert d.route(2048, 4096, 4096, "bf16").path == "exact"
    kept, plan = _first_call(d, 2048)
    assert kept is None and plan.ran == 1 and slower.calls == 1
    assert d.explain(2048, 4096, 4096) == (
        "2048x4096x4096 bf16: cublas: first-call guard measured 0.950x cuBLAS on this shape for "
        "the exact entry 2048x4096x4096: cuBLAS is faster")
    assert d.route(128, 4096, 4096, "bf16").path == "exact"  # 1.077x: not thin, never timed
    assert _first_call(d, 128)[0] is not None and slower.calls == 1
    faster = FakeTimer(kernel_ms=1.0, cublas_ms=1.1)
    kept_d = _dispatcher(tmp_path / "other", faster, table=_thin_table())
    assert _first_call(kept_d, 2048)[0] is not None and faster.calls == 1
    route = kept_d.route(2048, 4096, 4096, "bf16")
    assert (route.path, route.entry.M, route.ratio) == ("guarded", 2048, 1.1)
    monkeypatch.setattr(guard, "capturing", lambda: True)  # first seen in capture: the entry
    untimed = FakeTimer(2.0, 1.0)
    captured = _dispatcher(tmp_path / "capture", untimed, table=_thin_table())
    kept, plan = _first_call(captured, 2048)
    assert kept is not None and untimed.calls == 0
    assert captured.route(2048, 4096, 4096, "bf16").path == "exact"


def test_broken_or_unwritable_cache_files_cost_only_a_measurement(tmp_path):
    (tmp_path / "guard.json").write_text("{not json")
    d = _dispatcher(tmp_path, FakeTimer(2.0, 1.0))
    assert d.route(1024, 4096, 4096, "bf16").path == "calibrated"
    _first_call(d, 1024)
    assert json.loads((tmp_path / "guard.json").read_text())["format"] == 1
    ro = guard.DecisionCache(tmp_path / "missing" / "dir" / "x" / "guard.json")
    (tmp_path / "missing").write_text("a file, not a directory")
    ro.put("k", guard.Decision(True, 1.1, 1.0, 1.1))
    assert ro.get("k") == guard.Decision(True, 1.1, 1.0, 1.1)  # kept for the process


def test_decide_keeps_the_faster():
    assert guard.decide(lambda k, c: (1.0, 1.01), None, None).kernel
    assert not guard.decide(lambda k, c: (1.0, 0.99), None, None).kernel
    assert guard.decide(lambda k, c: (1.0, 0.99), None, None, min_ratio=0.95).kernel


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True)])
def test_env_switch(monkeypatch, value, on):
    monkeypatch.setenv(guard.ENV, value)
    assert guard.enabled_by_env() is on


def test_capturing_sees_graph_capture_and_compile_tracing(monkeypatch):
    assert guard.capturing() is False  # eager, nothing captured
    seen = []

    @torch.compile(backend="eager", fullgraph=True)
    def traced(x):
        seen.append(guard.capturing())  # runs while dynamo traces
        return x + 1

    traced(torch.zeros(2))
    torch._dynamo.reset()
    assert seen == [True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert guard.capturing() is False
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert guard.capturing() is True


@pytest.mark.parametrize("pair_ms, more", [(0.05, 9), (0.5, 5), (0.6, 4), (1.0, 2), (1.6, 0),
                                           (2.4, 0), (6.0, 0)])
def test_the_guard_times_as_many_more_pairs_as_its_budget_holds(pair_ms, more):
    assert guard.more_pairs(pair_ms, budget_ms=3.0) == more  # ten pairs in all at most


class FakeFlush:
    def __init__(self, l2_bytes):
        self.l2_bytes = l2_bytes

    def __call__(self):
        pass


# the kernel's first launch takes twice its time (a freshly loaded module), and so does the last
# cuBLAS launch (disturbed): the first pair sizes the rest; flush_ms counts twice per pair, and
# guard.HOST_MS (0.5) of the 3 ms is kept for the host's share: (0.3, 0.35) times 2 pairs, not 3
@pytest.mark.parametrize("kernel_ms, cublas_ms, flush_ms, pairs", [
    (1.4, 1.0, 0.0, 1), (0.3, 0.2, 0.0, 3), (0.3, 0.35, 0.0, 2), (0.1, 0.1, 0.0, 8),
    (0.1, 0.1, 0.05, 6), (0.01, 0.01, 0.0, 10), (4.0, 3.0, 0.0, 1)])
def test_the_cuda_timer_times_one_pair_then_what_the_budget_holds_and_takes_minimums(
        monkeypatch, kernel_ms, cublas_ms, flush_ms, pairs):
    from tunefw.evaluate import method

    calls, launched = [], []

    def time_each(launches, flush, wait):
        calls.append(len(launches))
        if all(isinstance(launch, FakeFlush) for launch in launches):
            return [flush_ms] * len(launches)  # the flush, timed once when the timer is made
        assert isinstance(flush, FakeFlush)  # the kernel and cuBLAS are timed flushed
        names = [launch() for launch in launches]
        launched.extend(names)
        times = [kernel_ms if name == "kernel" else cublas_ms for name in names]
        if len(calls) == 2:
            times[0] *= 2  # the kernel's first launch
        elif len(calls) == 3:
            times[-1] *= 2  # the last cuBLAS launch
        return times

    monkeypatch.setattr(method, "L2Flush", FakeFlush)
    monkeypatch.setattr(method, "time_each", time_each)
    timer = guard.cuda_timer(50 << 20, budget_ms=3.0)
    assert calls == [2]  # the flush, twice
    measured = timer(lambda: "kernel", lambda: "cublas")
    assert calls[1:] == ([2] if pairs == 1 else [2, 2 * (pairs - 1)])  # no untimed sizing pair
    assert launched == ["kernel", "cublas"] * pairs  # interleaved
    if pairs == 1:  # one sample each: the first launch is all there is
        assert measured == pytest.approx((2 * kernel_ms, cublas_ms))
    else:  # the minimum drops the kernel's slow first launch and the disturbed cuBLAS one
        assert measured == pytest.approx((kernel_ms, cublas_ms))


class CudaLike(torch.Tensor):
    """CPU storage that the dispatcher takes for an operand on CUDA device 0."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0


class MarkedPlan(FakePlan):
    """A fake kernel: computes nothing, returns C filled with its entry's M (so a call shows
    which plan served it)."""

    def __init__(self, entry, M, N, K):
        super().__init__(M, N, K)
        self.entry, self.mark = entry, float(entry.M)

    def __call__(self, a, b, lead=None, programmatic=True):
        self.ran += 1
        self.programmatic.append(programmatic)
        return torch.full((*(lead or (a.shape[0],)), b.shape[0]), self.mark, dtype=a.dtype)


def test_the_graph_capture_path_with_a_fake_kernel(tmp_path, monkeypatch):
    timed = []
    # the guard's path alone: first-use verification (runtime/firstuse.py) has its own tests
    d = _dispatcher(tmp_path, lambda kernel, cublas: timed.append(1) or (1.0, 2.0), verify=False)
    built = []
    monkeypatch.setattr(d, "_build", lambda e, M, N, K, index: built.append(MarkedPlan(e, M, N, K))
                        or built[-1])
    b = torch.empty(4096, 4096, dtype=torch.bfloat16).as_subclass(CudaLike)
    a = torch.zeros(1010, 4096, dtype=torch.bfloat16).as_subclass(CudaLike)
    monkeypatch.setattr(guard, "capturing", lambda: True)  # inside torch.cuda.graph(...)
    for _ in range(2):  # first seen during capture: the table's rule, its kernel, nothing timed
        c = d.gemm(a, b)
        assert c.shape == (1010, 4096) and torch.all(c == 2048)
    assert timed == [] and [p.ran for p in built] == [2]  # one plan for the capture
    assert d.route_for(a, b).path == "calibrated"
    assert d.explain(1010, 4096, 4096).endswith("the table's rule, not timed]")
    monkeypatch.setattr(guard, "capturing", lambda: False)  # eager again, after the capture
    assert torch.all(d.gemm(a, b) == 2048) and timed == [1]  # its own plan, timed now
    assert [p.ran for p in built] == [2, 1]  # (a workspace zeroed eagerly, not by a replay)
    assert d.route(1010, 4096, 4096, "bf16").path == "guarded"
    assert "not timed" not in d.explain(1010, 4096, 4096)
    monkeypatch.setattr(guard, "capturing", lambda: True)  # a later capture: the eager plan
    assert torch.all(d.gemm(a, b) == 2048) and [p.ran for p in built] == [2, 2] and timed == [1]


# ---- unproven routes: calibration evidence on one side of the asked M only ---------------------
def _unproven_dispatcher(tmp_path, monkeypatch, timer, **kw):
    """A dispatcher whose kernels are MarkedPlans and whose first-use verification is recorded."""
    from tunefw.evaluate.method import Verdict
    from tunefw.runtime import firstuse

    events, built = [], []
    d = _dispatcher(tmp_path, lambda kernel, cublas: events.append("timed") or timer(kernel, cublas), **kw)
    monkeypatch.setattr(d, "_build", lambda e, M, N, K, index: built.append(MarkedPlan(e, M, N, K))
                        or built[-1])
    monkeypatch.setattr(firstuse, "verify_plan", lambda plan, spec: events.append("verified")
                        or Verdict(True, 0.0))
    return d, events, built


def _operands(M):
    b = torch.empty(4096, 4096, dtype=torch.bfloat16).as_subclass(CudaLike)
    return torch.zeros(M, 4096, dtype=torch.bfloat16).as_subclass(CudaLike), b


def test_an_unproven_route_is_cublas_until_the_guard_times_its_kernel(tmp_path, monkeypatch):
    d, events, built = _unproven_dispatcher(tmp_path, monkeypatch, FakeTimer(1.0, 1.25))
    route = d.route(300, 4096, 4096, "bf16")  # measured at M=1000 only, above 300
    assert (route.path, route.entry, route.donor.M, route.ratio) == ("unproven", None, 2048, 1.1)
    a, b = _operands(300)
    monkeypatch.setattr(guard, "capturing", lambda: True)  # first seen during capture: cuBLAS
    assert torch.all(d.gemm(a, b) == 0) and built == [] and events == []
    assert d.explain(300, 4096, 4096) == (
        "300x4096x4096 bf16: unproven: calibration measured 1.100x at M=1000 only, on one side of "
        "M=300 for the bucket entry 2048x4096x4096: unproven, cuBLAS unless the guard measures it; "
        f"kernel {FAMILIES['wgmma_sm90'].name_expression(CONFIG, 'bf16')} compiled on first use "
        "[guard: first seen during CUDA-graph capture or torch.compile tracing: the table's rule, "
        "not timed]")
    monkeypatch.setattr(guard, "capturing", lambda: False)  # eager: built, verified, then timed
    assert torch.all(d.gemm(a, b) == 2048) and events == ["verified", "timed"]
    assert [p.ran for p in built] == [2]  # the timer's pair, then the call itself
    route = d.route(300, 4096, 4096, "bf16")
    assert (route.path, route.entry.M, route.ratio) == ("guarded", 2048, 1.25)
    assert d.explain(300, 4096, 4096).startswith(
        "300x4096x4096 bf16: guarded: first-call guard measured 1.250x cuBLAS on this shape: kept "
        "the bucket entry 2048x4096x4096; calibration measured 1.100x at M=1000 only, on one side")
    again = _dispatcher(tmp_path, FakeTimer(2.0, 1.0))  # a new process reads the decision
    assert again.route(300, 4096, 4096, "bf16").path == "guarded" and again._guard.timer.calls == 0


def test_an_unproven_route_the_guard_finds_slower_or_cannot_time_stays_cublas(tmp_path, monkeypatch):
    d, events, built = _unproven_dispatcher(tmp_path, monkeypatch, FakeTimer(2.0, 1.0))
    a, b = _operands(200)  # measured at M=1000 only, above 200
    assert d.route(200, 4096, 4096, "bf16").path == "unproven"
    assert torch.all(d.gemm(a, b) == 0) and events == ["verified", "timed"] and built[0].ran == 1
    route = d.route_for(a, b)
    assert (route.path, route.entry, route.donor.M, route.ratio) == ("cublas", None, 2048, 0.5)
    assert d.explain(200, 4096, 4096) == (
        "200x4096x4096 bf16: cublas: first-call guard measured 0.500x cuBLAS on this shape for "
        "the bucket entry 2048x4096x4096: cuBLAS is faster")
    off, events, built = _unproven_dispatcher(tmp_path / "off", monkeypatch, FakeTimer(1.0, 2.0),
                                              guard=False)
    assert torch.all(off.gemm(a, b) == 0) and built == [] and events == []  # nothing built or timed
    assert off.route_for(a, b).path == "unproven"
    failed, events, _ = _unproven_dispatcher(tmp_path / "bad", monkeypatch, FakeTimer(1.0, 2.0))
    from tunefw.evaluate.method import Verdict
    from tunefw.runtime import firstuse
    monkeypatch.setattr(firstuse, "verify_plan", lambda plan, spec: Verdict(False, 1.0, "wrong"))
    with pytest.warns(RuntimeWarning, match="failed strict verification"):
        assert torch.all(failed.gemm(a, b) == 0)
    assert events == []  # a kernel that fails its verification is never timed
    assert failed.route_for(a, b).reason.startswith(
        "the kernel of the unproven entry 2048x4096x4096 is unavailable: failed strict verification")
