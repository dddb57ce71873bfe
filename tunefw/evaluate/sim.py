"""SIMULATED device: a modeled H200 so the whole pipeline runs on a CPU machine (tests, demo).

The timing model is a roofline with tile and wave quantization and occupancy; it is a stand-in,
never a measurement, and everything it produces says so (evaluator 'sim', a 'SIMULATED'
fingerprint). Faults are real: a crash exits the worker process, a hang blocks until the
watchdog kills it, a wrong answer is rejected by the real verifier, a compile error comes from
really compiling broken source. A trial without a fault has no output to verify (no rel_err),
so a simulated worker imports torch (seconds of a small machine's CPU) only where its study
injects wrong answers, then at its start: not inside a trial's timeout.
"""
from __future__ import annotations

import hashlib
import importlib
import math
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tunefw.device import SIM_DEVICE, DeviceSpec
from tunefw.evaluate.method_id import METHOD
from tunefw.outcome import Outcome, Status, TrialSpec
from tunefw.problem import GemmProblem
from tunefw.study.spec import FAULTS, SimSettings
from tunefw.templates import get_family
from tunefw.templates.base import KernelTemplate

if TYPE_CHECKING:
    from tunefw.evaluate.method import Verdict

CUBLAS_EFFICIENCY = 0.80
LAUNCH_US = 4.0


def sim_fingerprint(device: DeviceSpec = SIM_DEVICE) -> dict:
    return {"name": f"SIMULATED {device.name}", "simulated": True, "cc": device.cc,
            "sm_count": device.sm_count, "driver": "sim", "cuda": "sim", "compiler": "sim",
            "method": METHOD}


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the given parts (same config -> same draw)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def draw_fault(spec: TrialSpec, settings: SimSettings) -> str | None:
    """Which fault (if any) this config has; deterministic so a retry meets the same fault."""
    config = get_family(spec.family).as_written_before(spec.config)
    u = _unit("fault", spec.family, sorted(config.items()), spec.problem, spec.seed)
    edge = 0.0
    for fault in FAULTS:
        edge += settings.faults.get(fault, 0.0)
        if u < edge:
            return fault
    return None


def model_time_ms(family: str, config: dict, problem: GemmProblem,
                  device: DeviceSpec = SIM_DEVICE) -> float:
    """Modeled kernel time: max(compute over the quantized tiles and waves, memory) + launch."""
    tpl = get_family(family)
    res = tpl.estimate(config)
    hint = tpl.cost_hint(config)  # the family says what its knobs mean for the model
    bm, bn, bk = hint.tile_m, hint.tile_n, hint.tile_k
    split, stages = hint.split_k, hint.stages
    tiles = math.ceil(problem.M / bm) * math.ceil(problem.N / bn)
    ctas = tiles * split
    per_sm = max(1, min(device.smem_per_sm // max(res.smem_bytes, 1),
                        device.regs_per_sm // max(res.regs_per_thread * res.threads, 1),
                        2048 // res.threads))
    slots = device.sm_count * min(per_sm, 2)
    waves = math.ceil(ctas / slots)
    intensity = bm * bn / (bm + bn)  # FLOP per operand byte of a tile, up to constants
    eff = hint.efficiency * intensity / (intensity + 12.0) * 1.15
    eff *= min(1.0, 0.55 + 0.15 * stages) * (1.0 if per_sm >= 2 or tiles >= 64 else 0.92)
    if not hint.swizzled:
        eff *= 0.8  # bank conflicts on ldmatrix / wgmma reads
    # Every other knob moves the result a little, deterministically, as real ones do.
    eff *= 0.96 + 0.08 * _unit("knobs", family, sorted(tpl.as_written_before(config).items()),
                               problem.key())
    k_per_cta = math.ceil(problem.K / split / bk) * bk
    tile_flops = 2.0 * bm * bn * k_per_cta
    per_slot_tflops = device.peak_tflops_bf16 * eff / slots
    compute_ms = waves * tile_flops / (per_slot_tflops * 1e9)
    bytes_moved = problem.min_bytes + (8 * problem.M * problem.N * split if split > 1 else 0)
    memory_ms = bytes_moved / (device.mem_bandwidth_gbs * 0.9e6)
    return max(compute_ms, memory_ms) + LAUNCH_US / 1000.0


def cublas_time_ms(problem: GemmProblem, device: DeviceSpec = SIM_DEVICE) -> float:
    compute_ms = problem.flops / (device.peak_tflops_bf16 * CUBLAS_EFFICIENCY * 1e9)
    tiles = math.ceil(problem.M / 128) * math.ceil(problem.N / 256)
    quant = math.ceil(tiles / device.sm_count) * device.sm_count / max(tiles, 1)
    memory_ms = problem.min_bytes / (device.mem_bandwidth_gbs * 0.9e6)
    return max(compute_ms * min(quant, 2.0), memory_ms) + LAUNCH_US / 1000.0


class SimEvaluator:
    """Evaluates a trial on the modeled device, spending real wall time like a GPU would."""

    name = "sim"

    def __init__(self, settings: SimSettings, gpu: str = "") -> None:
        self.settings = settings
        self.gpu = gpu or os.environ.get("CUDA_VISIBLE_DEVICES", "")
        if settings.faults.get("wrong"):  # the verifier's torch, loaded before any trial's clock
            importlib.import_module("tunefw.evaluate.method")

    def fingerprint(self) -> dict:
        return sim_fingerprint()

    def device_spec(self) -> DeviceSpec:
        return SIM_DEVICE

    def evaluate(self, spec: TrialSpec, compiled: object = None) -> Outcome:
        start = time.perf_counter()
        fault = draw_fault(spec, self.settings)
        base = dict(fingerprint=self.fingerprint(), gpu=self.gpu, evaluator=self.name)
        if fault == "compile_error":
            return Outcome(Status.COMPILE_ERROR, log=compile_broken_source(spec), **base)
        if fault == "crash":
            os._exit(17)  # the worker process dies, as after a fatal driver error
        if fault == "hang":
            while True:  # a kernel that never finishes: only the watchdog ends this
                time.sleep(3600)
        time.sleep(self.settings.trial_seconds)
        problem = GemmProblem(**spec.problem)
        if fault == "wrong":
            verdict = wrong_answer_verdict(spec)
            return Outcome(Status.WRONG_ANSWER, log=f"SIMULATED: {verdict.reason}",
                           rel_err=verdict.rel_err, busy_s=time.perf_counter() - start, **base)
        busy = time.perf_counter() - start
        t = model_time_ms(spec.family, spec.config, problem)
        jitter = 1.0 + 0.01 * (_unit("noise", spec.trial_id) - 0.5)
        t *= jitter
        tc = cublas_time_ms(problem)
        return Outcome(Status.OK, log="SIMULATED device: modeled timing", median_ms=t,
                       min_ms=t * 0.99, iqr_ms=t * 0.01, tflops=problem.flops / t / 1e9,
                       cublas_tflops=problem.flops / tc / 1e9,
                       cublas_median_ms=tc, busy_s=busy, **base)

    def confirm(self, spec: TrialSpec, compiled: object = None) -> Outcome:
        """The longer interleaved re-timing; on the model, the noise-free figures."""
        problem = GemmProblem(**spec.problem)
        t = model_time_ms(spec.family, spec.config, problem)
        tc = cublas_time_ms(problem)
        return Outcome(Status.OK, log="SIMULATED confirmation", median_ms=t, min_ms=t,
                       iqr_ms=0.0, tflops=problem.flops / t / 1e9,
                       cublas_tflops=problem.flops / tc / 1e9, cublas_median_ms=tc,
                       fingerprint=self.fingerprint(), gpu=self.gpu, evaluator=self.name)


def wrong_answer_verdict(spec: TrialSpec) -> Verdict:
    """The real verifier's verdict on a small CPU GEMM standing in for a wrong kernel's output:
    one row off by 3%, what the per-row check must catch where the global norm hides it."""
    from tunefw.evaluate import method  # torch, imported when the evaluator was made

    dtype = spec.problem["dtype"]
    a, b = method.make_inputs(48, 40, 64, dtype, seed=spec.trial_id)
    ref = method.reference(a, b)
    out = ref.to(method.TORCH_DTYPE[dtype])
    baseline = (a @ b.T) if dtype == "bf16" else out.clone()
    out[7] = out[7] * 1.03
    return method.verify(out, ref, dtype, baseline=baseline)


BROKEN_KERNEL = """
template <int N> __global__ void broken_kernel(float* out) {
    out[threadIdx.x] = undefined_symbol_for_fault_injection * N;
}
"""


class _BrokenTemplate(KernelTemplate):
    """A one-kernel family whose source does not compile: the compile-error fault."""

    family = "sim_broken"
    source = "broken.cuh"
    kernel = "broken_kernel"

    def template_args(self, config: dict, dtype: str, gate: str = "none") -> list[str]:
        return ["1"]


def compile_broken_source(spec: TrialSpec) -> str:
    """Really compile broken CUDA (NVRTC, through the compiler) and return the compiler's log."""
    from tunefw.cuda.compiler import compile_kernel

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / _BrokenTemplate.source).write_text(BROKEN_KERNEL)
        result = compile_kernel(_BrokenTemplate(), {}, spec.problem["dtype"], "sm_90a",
                                source_dir=Path(tmp), cache_dir=Path(tmp) / "cache")
    return f"SIMULATED fault: broken source compiled for real\n{result.log}"
