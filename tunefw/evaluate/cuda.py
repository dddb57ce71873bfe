"""The real-GPU evaluator: load a cubin, launch it on torch tensors, verify it, time it.

One CudaEvaluator lives in one GPU worker process and owns that process's CUDA context. CUDA
failures come back as Outcomes: a sticky error (illegal address, launch failure, ...) or a kernel
past the trial deadline marks the Outcome ``poisoned`` and the worker must be restarted; every
later call on a poisoned evaluator is refused the same way.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import torch

from tunefw.cuda.compiler import CompileResult, compiler_info
from tunefw.cuda import driver
from tunefw.cuda.driver import CudaFailure, classify
from tunefw.device import DeviceSpec
from tunefw.evaluate import method
from tunefw.evaluate.strict import GuardedOutput, Operands, strict_verify
from tunefw.outcome import Outcome, Status, TrialSpec
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES
from tunefw.templates.base import KernelTemplate, Launch

MODULES_KEPT = 64
INPUT_SETS_KEPT = 2
POLL_S = 1e-4
WARM_UP_S = 1.0
SMALL_GRID_SMS = 8  # strict verification's small grid for kernels whose grid follows the SM count


class TrialTimeout(Exception):
    """The GPU was still busy with the trial's work at its deadline."""


@dataclass
class _Inputs:
    """One problem's operands (with pristine copies, the fp32 reference and cuBLAS's output),
    the guarded output and cuBLAS's timing scratch."""

    operands: Operands
    out: GuardedOutput
    scratch: torch.Tensor
    gate: str = "none"

    @property
    def a(self) -> torch.Tensor:
        return self.operands.a

    @property
    def b(self) -> torch.Tensor:
        return self.operands.b

    def cublas(self) -> None:
        """cuBLAS on the same operands (method.stock) as a launch: each screen's anchor."""
        method.stock(self.a, self.b, self.gate, self.scratch)


def _tflops(problem: GemmProblem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


class CudaEvaluator:
    """Measures trials on one GPU (cuda:device_index) with the method of method.py."""

    def __init__(self, device_index: int = 0,
                 families: Mapping[str, KernelTemplate] | None = None,
                 warm_up_s: float = WARM_UP_S) -> None:
        """``warm_up_s``: seconds of matrix work before the first measurement (0 where nothing
        is timed)."""
        self.families = dict(FAMILIES if families is None else families)
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference must be float32
        torch.empty(1, device=self.device)  # creates the primary context and makes it current
        self._cu_device = driver.device(device_index)
        self._context = driver.primary_context(self._cu_device)
        self._spec = self._live_spec()
        self._static = self._static_fingerprint()
        self._flush = method.L2Flush(self._spec.l2_bytes, self.device)
        self._modules: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._inputs: OrderedDict[tuple[str, int], _Inputs] = OrderedDict()
        self._workspace = torch.zeros(0, dtype=torch.uint8, device=self.device)
        self._rotation: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._rotation_key: tuple | None = None
        self._anchors = method.AnchorWatch()
        self._poisoned = ""
        self._nvml = _Nvml(self._static["uuid"])
        self._warm_up(warm_up_s)

    def _warm_up(self, seconds: float) -> None:
        """Sustained matrix work before the first measurement, so clocks and temperature are at
        their working level: on a cold H200 the first of five screens of one config ran 2.6%
        faster than the other four (benchmarks/results/evaluator_gpu_check_h200.json)."""
        a = torch.randn(4096, 4096, device=self.device, dtype=torch.bfloat16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                torch.mm(a, a)
            torch.cuda.synchronize(self.device)

    # ---- device identity ------------------------------------------------------------------
    def _live_spec(self) -> DeviceSpec:
        props = torch.cuda.get_device_properties(self.device)
        return driver.device_spec(self._cu_device, props.name, props.major * 10 + props.minor)

    def _static_fingerprint(self) -> dict:
        return {"name": self._spec.name, "uuid": driver.device_uuid(self._cu_device),
                "cc": self._spec.cc, "sm_count": self._spec.sm_count, "driver": None,
                "cuda_driver_api": driver.driver_api_version(),
                "cuda": torch.version.cuda, "compiler": compiler_info().label,
                "method": method.METHOD}

    def device_spec(self) -> DeviceSpec:
        """The limits of this GPU as read from the driver (for template checks and launches)."""
        return self._spec

    def fingerprint(self) -> dict:
        """Identity of the GPU and software, plus SM clock and power limit read now (NVML)."""
        return {**self._static, **self._nvml.now()}

    @property
    def gpu(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES") or self._static["uuid"]

    # ---- trials ---------------------------------------------------------------------------
    def evaluate(self, spec: TrialSpec, compiled: CompileResult) -> Outcome:
        """Verify, then screen one config anchored with cuBLAS; failures come back as Outcomes."""
        return self._trial(spec, compiled, confirm=None)

    def confirm(self, spec: TrialSpec, compiled: CompileResult, launches: int = 100,
                min_ms: float = 300.0) -> Outcome:
        """Verify, then time the config interleaved with cuBLAS (A B A B ...), longer runs."""
        return self._trial(spec, compiled, confirm=(launches, min_ms))

    def verify(self, spec: TrialSpec, compiled: CompileResult) -> Outcome:
        """Strict verification alone (no timing): OK or WRONG_ANSWER with the reason."""
        return self._trial(spec, compiled, confirm=None, timed=False)

    def _trial(self, spec: TrialSpec, compiled: CompileResult,
               confirm: tuple[int, float] | None, timed: bool = True) -> Outcome:
        start = time.perf_counter()
        if self._poisoned:
            outcome = Outcome(Status.RUNTIME_CRASH, log=f"worker context already poisoned: {self._poisoned}",
                              poisoned=True)
        elif not compiled.ok:
            outcome = Outcome(compiled.status, log=compiled.log)
        else:
            outcome = self._guarded(spec, compiled, start + spec.timeout_s, confirm, timed)
        if outcome.poisoned and not self._poisoned:
            self._poisoned = outcome.log
        outcome.busy_s = time.perf_counter() - start
        outcome.fingerprint = self.fingerprint()
        outcome.gpu, outcome.evaluator, outcome.compile_s = self.gpu, "cuda", compiled.seconds
        return outcome

    def _guarded(self, spec: TrialSpec, compiled: CompileResult, deadline: float,
                 confirm: tuple[int, float] | None, timed: bool) -> Outcome:
        """_measure with every CUDA failure turned into its Outcome."""
        try:
            driver.set_current(self._context)
            return self._measure(spec, compiled, deadline, confirm, timed)
        except TrialTimeout as exc:
            return Outcome(Status.TIMEOUT, log=str(exc), poisoned=True)
        except CudaFailure as exc:
            status, poisoned = classify(exc)
            return Outcome(status, log=str(exc), poisoned=poisoned)
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            return Outcome(Status.OUT_OF_RESOURCES, log=f"device memory: {exc}".splitlines()[0])
        except RuntimeError as exc:  # torch saw a CUDA error the driver calls did not surface
            if "CUDA" not in str(exc):
                raise
            return Outcome(Status.RUNTIME_CRASH, log=str(exc).splitlines()[0], poisoned=True)

    def _measure(self, spec: TrialSpec, compiled: CompileResult, deadline: float,
                 confirm: tuple[int, float] | None, timed: bool = True) -> Outcome:
        template = self.families[spec.family]
        problem = GemmProblem(**spec.problem)
        launch = template.launch(spec.config, problem, self._spec)
        function = self._function(compiled, launch)
        inputs = self._inputs_for(problem, spec.seed)
        workspace = self._workspace_for(launch.workspace_bytes)
        ptrs = {"a": inputs.a.data_ptr(), "b": inputs.b.data_ptr(), "c": inputs.out.c.data_ptr(),
                "workspace": workspace.data_ptr() if launch.workspace_bytes else 0}
        args = template.kernel_args(spec.config, problem, ptrs)
        params = (tuple(v for v, _ in args), tuple(t for _, t in args))
        run = lambda: self._launch(function, launch, params)  # noqa: E731
        wait = lambda: self._wait(deadline)  # noqa: E731
        small = self._small_grid_launch(template, spec.config, problem, launch, compiled, params)

        def rotations() -> tuple[list[Callable[[], None]], list[Callable[[], None]]]:
            """Kernel and cuBLAS launches over copies of the operands (see _copies)."""
            runs, anchors = [run], [inputs.cublas]
            for a, b in self._copies(problem, inputs)[1:]:
                copy = {**ptrs, "a": a.data_ptr(), "b": b.data_ptr()}
                cargs = template.kernel_args(spec.config, problem, copy)
                cparams = (tuple(v for v, _ in cargs), tuple(t for _, t in cargs))
                runs.append(lambda p=cparams: self._launch(function, launch, p))
                anchors.append(lambda a=a, b=b: method.stock(a, b, problem.gate, inputs.scratch))
            return runs, anchors

        verdict = strict_verify(run, wait, inputs.out, inputs.operands, problem.dtype, small)
        if not verdict.ok:
            return Outcome(Status.WRONG_ANSWER, log=verdict.reason, rel_err=verdict.rel_err)
        if not timed:
            return Outcome(Status.OK, log="strictly verified", rel_err=verdict.rel_err)

        timing, cublas, note = self._time(run, inputs.cublas, wait, confirm, rotations,
                                          key=problem.key())
        return Outcome(Status.OK, log=note, median_ms=timing.median_ms, min_ms=timing.min_ms,
                       iqr_ms=timing.iqr_ms, tflops=_tflops(problem, timing.median_ms),
                       rel_err=verdict.rel_err, cublas_tflops=_tflops(problem, cublas.median_ms),
                       cublas_median_ms=cublas.median_ms)

    def _time(self, run: Callable[[], None], cublas: Callable[[], None],
              wait: Callable[[], None], confirm: tuple[int, float] | None,
              rotations: Callable[[], tuple[list, list]] | None = None, key: str = ""
              ) -> tuple[method.Timing, method.Timing, str]:
        """Kernel and cuBLAS timings and how they were taken: three paired probe launches say
        whether the kernel is small (then both are timed as CUDA graphs, cycling over
        ``rotations()``'s operand copies so that no launch of a graph finds the last one's
        operands in L2), an anchored screen (taken again where its cuBLAS anchor ran DISTURBED
        times the problem's fastest: ``key`` names the problem), then for a confirmation the
        longer interleaved run."""
        kernel, anchor, per_sample = run, cublas, 1
        probe = method.time_each([run, cublas] * method.WARMUP_LAUNCHES, self._flush, wait)
        if min(probe[0::2]) < method.GRAPH_BELOW_MS:
            per_sample = method.graph_repeats(min(probe[0::2]))
            runs, anchors = rotations() if rotations else ([run], [cublas])
            kernel = method.capture_graph(runs, per_sample)
            anchor = method.capture_graph(anchors, per_sample)
        timing, anchored = method.anchored_screen(kernel, anchor, self._flush, wait,
                                                  launches_per_sample=per_sample)
        again = ""
        slowdown = self._anchors.slowdown((key, per_sample > 1), anchored.median_ms)
        if slowdown:
            timing, anchored = method.anchored_screen(kernel, anchor, self._flush, wait,
                                                      launches_per_sample=per_sample)
            self._anchors.slowdown((key, per_sample > 1), anchored.median_ms)
            again = (f"; screened again: cuBLAS had run {slowdown:.1f}x its fastest on this "
                     "problem (a disturbed GPU)")
        how = "screened"
        if confirm:
            timing, anchored = method.interleaved(kernel, anchor, self._flush, wait,
                                                  min_launches=confirm[0], min_ms=confirm[1],
                                                  launches_per_sample=per_sample)
            how = "confirmed over"
        unit = "launches" if per_sample == 1 else f"CUDA graphs of {per_sample} launches"
        return timing, anchored, f"{how} {timing.samples} {unit} interleaved with cuBLAS{again}"

    # ---- pieces ---------------------------------------------------------------------------
    def _small_grid_launch(self, template: KernelTemplate, config: dict, problem: GemmProblem,
                           launch: Launch, compiled: CompileResult,
                           params: tuple) -> Callable[[], None] | None:
        """The same kernel launched as on a GPU of SMALL_GRID_SMS SMs, where its grid depends on
        the GPU (a persistent scheduler then hands each CTA several work units), else None."""
        small = template.launch(config, problem, replace(self._spec, sm_count=SMALL_GRID_SMS))
        if small.grid == launch.grid:
            return None
        function = self._function(compiled, small)
        return lambda: self._launch(function, small, params)

    def _function(self, compiled: CompileResult, launch: Launch) -> Any:
        """The kernel (module cached by cache key), with its launch attributes set."""
        if compiled.key in self._modules:
            self._modules.move_to_end(compiled.key)
            function = self._modules[compiled.key][1]
        else:
            self._modules[compiled.key] = driver.load(compiled.cubin, compiled.lowered_name)
            function = self._modules[compiled.key][1]
            if len(self._modules) > MODULES_KEPT:
                _, (old, _) = self._modules.popitem(last=False)
                driver.unload(old)
        driver.configure(function, launch)
        return function

    def _launch(self, function: Any, launch: Launch, params: tuple) -> None:
        """One launch on torch's current stream (cuLaunchKernelEx when the config uses clusters)."""
        err = driver.launch_raw(function, launch, params,
                                torch.cuda.current_stream(self.device).cuda_stream)
        if err != driver.E.CUDA_SUCCESS:
            raise CudaFailure(err, "launch", driver.describe(launch))

    def _wait(self, deadline: float) -> None:
        """Block until the current stream is idle; CudaFailure on a kernel error, TrialTimeout late."""
        stream = torch.cuda.current_stream(self.device).cuda_stream
        while True:
            err = driver.stream_state(stream)
            if err == driver.E.CUDA_SUCCESS:
                return
            if err != driver.E.CUDA_ERROR_NOT_READY:
                raise CudaFailure(err, "run", "kernel execution")
            if time.perf_counter() > deadline:
                raise TrialTimeout("GPU work still running at the trial deadline (kernel hung?)")
            time.sleep(POLL_S)

    def _inputs_for(self, problem: GemmProblem, seed: int) -> _Inputs:
        """Operands, reference and cuBLAS output for a problem (the last few are kept)."""
        key = (problem.key(), seed)
        if key not in self._inputs:
            a, b = method.make_inputs(problem.M, problem.weight_rows, problem.K, problem.dtype,
                                      seed, device=str(self.device))
            cublas_out = torch.empty(problem.M, problem.N, dtype=a.dtype, device=a.device)
            method.stock(a, b, problem.gate, cublas_out)
            operands = Operands(a, b, a.clone(), b.clone(), method.reference(a, b, problem.gate),
                                cublas_out)
            self._inputs[key] = _Inputs(operands, GuardedOutput(cublas_out),
                                        torch.empty_like(cublas_out), problem.gate)
            if len(self._inputs) > INPUT_SETS_KEPT:
                self._inputs.popitem(last=False)
        self._inputs.move_to_end(key)
        return self._inputs[key]

    def _copies(self, problem: GemmProblem, inputs: _Inputs) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(A, B) and the copies a timing graph cycles over (method.rotation_copies)."""
        key = (problem.key(), inputs.a.data_ptr())
        if self._rotation_key != key:
            per_copy = inputs.a.numel() * inputs.a.element_size() + inputs.b.numel() * inputs.b.element_size()
            count = method.rotation_copies(per_copy, self._spec.l2_bytes)
            self._rotation = [(inputs.a, inputs.b)] + [(inputs.a.clone(), inputs.b.clone())
                                                       for _ in range(count - 1)]
            self._rotation_key = key
        return self._rotation

    def _workspace_for(self, nbytes: int) -> torch.Tensor:
        """A zeroed workspace of at least nbytes (grown when needed, zeroed once per trial)."""
        if nbytes > self._workspace.numel():
            self._workspace = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        elif nbytes:
            self._workspace.zero_()
        return self._workspace


class _Nvml:
    """SM clock, power (limit and draw) and temperature of one GPU via NVML; None where NVML
    cannot tell. Read at the end of each trial: a screen that ran on a dipped clock shows it."""

    def __init__(self, uuid: str) -> None:
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self.driver = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # NVML missing or the UUID unknown to it (e.g. MIG): record None
            self._nvml = self._handle = self.driver = None

    def now(self) -> dict:
        if self._handle is None:
            return {"driver": None, "sm_clock_mhz": None, "power_limit_w": None,
                    "power_w": None, "temperature_c": None}
        nvml = self._nvml
        return {"driver": self.driver,
                "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM),
                "power_limit_w": nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1000.0,
                "power_w": nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0,
                "temperature_c": nvml.nvmlDeviceGetTemperature(self._handle, nvml.NVML_TEMPERATURE_GPU)}
