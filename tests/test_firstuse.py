"""The runtime's first-use verification on CPU: fake kernels (torch ops on CPU tensors) judged by
the sweep's strict verification, and what the Dispatcher does with a kernel that fails on a
shape, during capture, and when verification is off."""
from __future__ import annotations

import warnings

import pytest
import torch

from tunefw.device import H200
from tunefw.evaluate.method import Verdict
from tunefw.problem import GemmProblem
from tunefw.runtime import firstuse, guard
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable
from tunefw.runtime.dispatcher import Dispatcher
from tunefw.templates import FAMILIES

PROBLEM = GemmProblem(24, 40, 64)
CPU = torch.device("cpu")
CONFIG = dict(FAMILIES["wgmma_sm90"].default_config(), CLUSTER_M=1)
ENTRY = DispatchEntry(2048, 4096, 4096, "bf16", "TN", "wgmma_sm90", CONFIG, 700.0, 650.0, 1)


def _kernel(flaw: str = ""):
    def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        c.copy_((a.float() @ b.float().T).to(c.dtype))
        if flaw == "last_row":  # right on the sweep's shape, wrong in a row this one adds
            c[-1].mul_(1.25)
        if flaw == "past_c":  # one element past C's end
            torch.as_strided(c, (1,), (1,), c.storage_offset() + c.numel()).fill_(0.0)
    return launch


def test_a_right_kernel_passes_and_the_flaws_the_sweep_catches_are_caught_here():
    assert firstuse.verify_first_use(PROBLEM, _kernel(), None, CPU).ok
    wrong = firstuse.verify_first_use(PROBLEM, _kernel("last_row"), None, CPU)
    assert not wrong.ok and wrong.reason.startswith("relative error ")
    outside = firstuse.verify_first_use(PROBLEM, _kernel("past_c"), None, CPU)
    assert not outside.ok and outside.reason.startswith("launch: wrote outside C: 1 element(s)")
    small = firstuse.verify_first_use(PROBLEM, _kernel(), _kernel("last_row"), CPU)
    assert not small.ok and small.reason.startswith("small grid: ")


class FakePlan:
    def __init__(self, M: int) -> None:
        self.problem, self.entry = GemmProblem(M, 4096, 4096), ENTRY


def _dispatcher(tmp_path, **kw) -> Dispatcher:
    table = DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, [ENTRY])
    return Dispatcher(table, gpu=H200, guard=False, guard_cache=tmp_path / "g.json", **kw)


def test_a_kernel_that_fails_on_a_shape_leaves_that_shape_to_cublas_with_one_warning(
        tmp_path, monkeypatch):
    calls = []

    def failing(plan, spec):
        calls.append(plan.problem.M)
        return Verdict(False, float("inf"), "launch: wrote outside C: 3 element(s)")
    monkeypatch.setattr(firstuse, "verify_plan", failing)
    d = _dispatcher(tmp_path)
    assert d.route(2048, 4096, 4096, "bf16").path == "exact"
    dev = d._devices[None]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert d._verified(FakePlan(2048), dev) is None
        assert d._verified(FakePlan(2048), dev) is None
    assert calls == [2048, 2048] and len(seen) == 1
    assert "failed strict verification on 2048x4096x4096:bf16" in str(seen[0].message)
    route = d.route(2048, 4096, 4096, "bf16")
    assert route.path == "cublas" and "wrote outside C" in route.reason


def test_no_verification_runs_during_capture_and_explain_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(firstuse, "verify_plan", lambda plan, spec: pytest.fail("ran in capture"))
    monkeypatch.setattr(guard, "capturing", lambda: True)
    d = _dispatcher(tmp_path)
    d.route(2048, 4096, 4096, "bf16")
    plan = FakePlan(2048)
    assert d._verified(plan, d._devices[None]) is plan
    assert d.explain(2048, 4096, 4096).endswith("[first seen during CUDA-graph capture or "
                                                "torch.compile tracing: not verified]")


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_verification_can_be_turned_off(tmp_path, monkeypatch, how):
    monkeypatch.setattr(firstuse, "verify_plan", lambda plan, spec: pytest.fail("verified"))
    if how == "environment":
        monkeypatch.setenv(firstuse.ENV, "0")
    d = _dispatcher(tmp_path, **({"verify": False} if how == "argument" else {}))
    d.route(2048, 4096, 4096, "bf16")
    plan = FakePlan(2048)
    assert d._verified(plan, d._devices[None]) is plan


def test_a_check_that_cannot_run_leaves_the_shape_to_cublas(tmp_path, monkeypatch):
    def oom(plan, spec):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB\nmore")
    monkeypatch.setattr(firstuse, "verify_plan", oom)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    d = _dispatcher(tmp_path)
    d.route(2048, 4096, 4096, "bf16")
    with pytest.warns(RuntimeWarning, match="could not run: CUDA out of memory"):
        assert d._verified(FakePlan(2048), d._devices[None]) is None
    assert d.route(2048, 4096, 4096, "bf16").path == "cublas"
