"""A kernel's first use on a shape: the strict verification every sweep trial gets
(tunefw/evaluate/strict.py) on random operands of the shape, before the kernel serves it.

A sweep verified each winner on its own shape, but the runtime also serves shapes no trial ran
(bucket, nearest and calibrated rules, unproven ones the guard times), so every (kernel, shape)
is verified once per process, when its plan is built and before the first-call guard times it
(its launches load the kernel's module, outside the guard's timing): C NaN-poisoned between
guard bands, A and B between guard bands and unchanged, a throw-away launch, then two on the
plan's own workspace that must be right and bit-identical, and a persistent kernel once more on
a small grid. A kernel that fails, or whose
check cannot run (out of device memory, a CUDA error), serves nothing on that shape (cuBLAS
does, with one warning naming the reason). The check costs one fp32 reference GEMM and a few
launches per shape and process, and holds A and B twice more while it runs. Nothing may run during
CUDA-graph capture or torch.compile tracing: a plan first built there serves unverified, and
explain() says so. Off with ``Dispatcher(..., verify=False)`` or ``TUNEFW_VERIFY=0``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from tunefw.device import DeviceSpec
from tunefw.evaluate import method
from tunefw.evaluate.strict import GuardedOutput, Operands, strict_verify
from tunefw.problem import GemmProblem
from tunefw.runtime.env import switch
from tunefw.runtime.plan import Plan, current_stream

ENV = "TUNEFW_VERIFY"
SEED = 0
# (A, B, C) -> one launch of the kernel writing C = A B^T
Launcher = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]


def enabled_by_env() -> bool:
    """False when $TUNEFW_VERIFY turns first-use verification off (0, false, no, off)."""
    return switch(ENV)


def verify_first_use(problem: GemmProblem, launch: Launcher, small_grid: Launcher | None,
                     device: torch.device) -> method.Verdict:
    """Strictly verify a kernel on random operands of ``problem`` on ``device`` (``small_grid``:
    the same kernel launched on a small grid, for a kernel whose grid follows the GPU)."""
    a, b = method.make_inputs(problem.M, problem.weight_rows, problem.K, problem.dtype, SEED,
                              device=str(device))
    cublas_out = torch.empty(problem.M, problem.N, dtype=a.dtype, device=device)
    method.stock(a, b, problem.gate, cublas_out)
    operands = Operands(a, b, a.clone(), b.clone(), method.reference(a, b, problem.gate), cublas_out)
    out = GuardedOutput(cublas_out)
    del a, b  # the operands hold banded copies
    small = (lambda: small_grid(operands.a, operands.b, out.c)) if small_grid else None
    wait = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return strict_verify(lambda: launch(operands.a, operands.b, out.c), wait, out, operands,
                         problem.dtype, small)


def verify_plan(plan: Plan, spec: DeviceSpec) -> method.Verdict:
    """verify_first_use for a runtime Plan on its own device and workspace."""
    from tunefw.cuda import driver
    from tunefw.evaluate.cuda import SMALL_GRID_SMS

    def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        plan.launch(plan.args(a.data_ptr(), b.data_ptr(), c.data_ptr()), current_stream(plan.index))

    small = plan.template.launch(plan.entry.config, plan.problem,
                                 replace(spec, sm_count=SMALL_GRID_SMS))
    small_grid = None
    if small.grid != plan.launch_geometry.grid:
        def small_grid(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
            params = plan.args(a.data_ptr(), b.data_ptr(), c.data_ptr())
            driver.launch_checked(plan.function, small, params, current_stream(plan.index))
    return verify_first_use(plan.problem, launch, small_grid, torch.device("cuda", plan.index))
