"""The runtime's hot path: a Plan is one (entry, shape, device) with its loaded kernel, launch
geometry, split-K workspace and argument buffers; DeviceState is one CUDA device's context and
loaded modules.

Hot path: per (shape, dtype, device) the chosen plan is cached; per plan the kernel argument
buffer (cuLaunchKernel's ``void**``) is cached per (a, b, c) address triple, so a call costs
the output allocation (torch's caching allocator), the operands' alignment and contiguity
checks, a few dict lookups and the launch. The split-K workspace is allocated and zeroed once
per plan (the kernels reset their own counters), so after the first call of a shape a call
allocates only C and never synchronizes: it can be captured in a CUDA graph. One plan's
workspace is shared: do not run the same split-K shape concurrently on two streams.

A family whose kernels wait for the kernel before them themselves (``programmatic_launch``) is
launched with programmatic stream serialization when $TUNEFW_PDL turns it on: its CTAs start
and set up (barriers, descriptors; no global memory) while that kernel's last CTAs finish, which
hides the launch gap between a model's kernels (eagerly and in CUDA graphs, which keep the
dependency). Tuning and its cuBLAS reference never launch this way, and neither do the runtime's
own kernel-against-cuBLAS decisions and benchmarks (the guard, calibration, tunefw bench: a plan
called with ``programmatic=False``): their timed launches follow an L2 flush, whose tail an
early start would overlap, so the decisions hold without the overlap and serving gets it on top.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

import torch

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.runtime import fastpath
from tunefw.runtime.dispatch import DispatchEntry
from tunefw.runtime.env import switch
from tunefw.templates.base import KernelTemplate, Launch

ARG_SETS_KEPT = 4096  # argument buffers cached per plan (distinct a, b, c address triples)
TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
ALIGN = 16  # bytes: cp.async and TMA need 16-byte aligned operand rows
PDL_ENV = "TUNEFW_PDL"


def programmatic_by_env() -> bool:
    """True only when $TUNEFW_PDL turns programmatic launches on (1, true, yes, on): off by
    default until a programmatic chain replayed from a CUDA graph matches the plain one bit for
    bit on the GPU (benchmarks/results/pdl_check_h200.json)."""
    return switch(PDL_ENV, default=False)


def _raw_stream_getter():
    """A fast current-stream function (index -> cudaStream_t as int)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw or (lambda index: torch.cuda.current_stream(index).cuda_stream)


current_stream = _raw_stream_getter()


def pack(args: list[tuple[Any, Any]]) -> tuple[int, tuple]:
    """cuLaunchKernel's ``void**`` for kernel_args() values: its address and what keeps it alive."""
    slots, keep = [], []
    for value, kind in args:
        if kind is None:  # a driver object (CUtensorMap): the kernel reads its own storage
            slots.append(value.getPtr())
            keep.append(value)
        else:
            boxed = kind(value)
            slots.append(ctypes.addressof(boxed))
            keep.append(boxed)
    array = (ctypes.c_void_p * len(slots))(*slots)
    return ctypes.addressof(array), (array, *keep)


class ArgBuilder:
    """A plan's argument buffers, one per operand address triple: (address, what keeps it alive,
    the split-K workspace included). The compiled path calls it on a triple it has not met; it
    holds no Plan, so a plan and its compiled launcher form no reference cycle."""

    def __init__(self, template: KernelTemplate, config: dict, problem: GemmProblem,
                 workspace: torch.Tensor | None) -> None:
        self.template, self.config, self.problem, self.workspace = template, config, problem, workspace
        self._ws_ptr = workspace.data_ptr() if workspace is not None else 0

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int) -> tuple[int, tuple]:
        """(the ``void**`` buffer's address, what keeps it alive) for these operand addresses."""
        ptrs = {"a": a_ptr, "b": b_ptr, "c": c_ptr, "workspace": self._ws_ptr}
        address, keep = pack(self.template.kernel_args(self.config, self.problem, ptrs))
        return address, (*keep, self.workspace)


class Plan:
    """One (entry, shape, device): the loaded kernel, its geometry, workspace and argument buffers."""

    def __init__(self, template: KernelTemplate, entry: DispatchEntry, problem: GemmProblem,
                 launch: Launch, function: Any, context: Any, device: torch.device,
                 programmatic: bool = False) -> None:
        """``programmatic``: launch with programmatic stream serialization (only for a family
        whose kernels wait for the kernel before them: KernelTemplate.programmatic_launch)."""
        from cuda.bindings import driver as cu
        from tunefw.cuda import driver

        self._cu, self._driver = cu, driver  # the hot launch calls cuda.bindings directly
        self.template, self.entry, self.problem, self.launch_geometry = template, entry, problem, launch
        self.function, self.context, self.index = function, context, device.index
        self.out_shape = self._m, self._n = problem.M, problem.N
        self._out_dtype = {v: k for k, v in TORCH_DTYPES.items()}[problem.dtype]
        self._device = device
        self.workspace = (torch.zeros(launch.workspace_bytes, dtype=torch.uint8, device=device)
                          if launch.workspace_bytes else None)
        self._build_args = ArgBuilder(template, entry.config, problem, self.workspace)
        self._args: dict[tuple[int, int, int], tuple[int, tuple]] = {}
        self._dims = (*launch.grid, *launch.block, launch.smem_bytes)
        self.programmatic = bool(programmatic and template.programmatic_launch)
        self._cluster = launch.cluster != (1, 1, 1)
        # cuLaunchKernelEx launches: CUlaunchConfig per (stream, programmatic)
        self._configs: dict[tuple[int, bool], Any] = {}
        # the compiled launcher (tunefw/runtime/fastpath.py) of a kernel launched without
        # programmatic stream serialization
        self.fast = None if self.programmatic else fastpath.kernel(
            function, launch, (problem.M, problem.N, problem.K, problem.weight_rows), device.index,
            self._out_dtype, self._build_args)

    def args(self, a_ptr: int, b_ptr: int, c_ptr: int) -> int:
        """The argument buffer's address for these operands (built once per address triple)."""
        key = (a_ptr, b_ptr, c_ptr)
        packed = self._args.get(key)
        if packed is None:
            packed = self._build_args(a_ptr, b_ptr, c_ptr)
            if len(self._args) >= ARG_SETS_KEPT:
                self._args.clear()
            self._args[key] = packed
        return packed[0]

    def prepared(self, a: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor]:
        """A plain launch of C = A B^T (returning C) into a C allocated now, its argument buffer
        built now: what the first-call guard times, so that only the launch is enqueued between
        its events (a new C or new tensor maps there can outlast the L2 flush before them and
        be timed as the kernel's; a large shape gets one timed pair, which cannot shed that)."""
        c = torch.empty(self._m, self._n, dtype=self._out_dtype, device=self._device)
        params = self.args(a.data_ptr(), b.data_ptr(), c.data_ptr())
        stream = current_stream(self.index)
        return lambda: self.launch(params, stream, False) or c

    def _config(self, stream: int, programmatic: bool) -> Any:
        config = self._configs.get((stream, programmatic))
        if config is None:
            config = self._configs[stream, programmatic] = self._driver.launch_config(
                self.launch_geometry, stream, programmatic)
        return config

    def launch(self, params: int, stream: int, programmatic: bool = True) -> None:
        """The raw launch: one kernel on ``stream`` with a prepared argument buffer, with
        programmatic stream serialization where the plan has it and ``programmatic`` asks."""
        pdl = programmatic and self.programmatic
        config = self._config(stream, pdl) if pdl or self._cluster else None
        if config is None:
            (err,) = self._cu.cuLaunchKernel(self.function, *self._dims, stream, params, 0)
        else:
            (err,) = self._cu.cuLaunchKernelEx(config, self.function, params, 0)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            self._retry(err, params, stream, config)

    def _retry(self, err: Any, params: int, stream: int, config: Any) -> None:
        """A thread without this device's context current: set it and launch again, once
        (with ``config``: cuLaunchKernelEx's, else a plain launch)."""
        d = self._driver
        if err in d.NO_CONTEXT_ERRORS:
            d.set_current(self.context)
            err = d.launch_raw(self.function, self.launch_geometry, params, stream, config)
        if err != d.E.CUDA_SUCCESS:
            raise d.CudaFailure(err, "launch", f"tunefw {self.entry.family} kernel for "
                                               f"{self.problem.key()}")

    def __call__(self, a: torch.Tensor, b: torch.Tensor, lead: tuple[int, ...] | None = None,
                 programmatic: bool = True) -> torch.Tensor | None:
        """C for operands of this plan's shape, or None when the kernel cannot read them
        (misaligned or not contiguous): the caller then uses torch.matmul. ``lead``: C's leading
        dimensions (their product is M; default (M,)), for an ``a`` of any rank whose rows are
        M x K in memory: a 3-D input gets its 3-D C without a reshape on either side.
        ``programmatic=False``: a plain launch even where the plan launches programmatically.
        The compiled launcher serves first where the plan has one (C in a's leading shape)."""
        fast = self.fast
        if fast is not None:
            c = fastpath.launch(fast, a, b)
            if c is not None:
                return c
        a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
        if (a_ptr | b_ptr) % ALIGN or not (a.is_contiguous() and b.is_contiguous()):
            return None
        # Sizes as separate ints: parsing them costs less than a shape tuple, on the hot path.
        c = (torch.empty(self._m, self._n, dtype=self._out_dtype, device=self._device) if lead is None
             else torch.empty(*lead, self._n, dtype=self._out_dtype, device=self._device))
        c_ptr = c.data_ptr()
        packed = self._args.get((a_ptr, b_ptr, c_ptr))
        params = packed[0] if packed is not None else self.args(a_ptr, b_ptr, c_ptr)
        self.launch(params, current_stream(self.index), programmatic)
        return c


class DeviceState:
    """Per CUDA device: its limits, why tuned kernels are refused (or None), loaded modules."""

    def __init__(self, spec: DeviceSpec, refusal: str | None, index: int | None) -> None:
        self.spec, self.refusal, self.index = spec, refusal, index
        self.context: Any = None
        self.functions: dict[str, Any] = {}  # cubin key -> CUfunction
        self.modules: list[Any] = []

    def function(self, key: str, cubin: bytes, lowered_name: str, launch: Launch) -> Any:
        """The kernel (module loaded once per cubin) with its launch attributes set."""
        from tunefw.cuda import driver

        if self.context is None:
            torch.empty(1, device=torch.device("cuda", self.index))  # creates the primary context
            self.context = driver.primary_context(driver.device(self.index))
        driver.set_current(self.context)
        if key not in self.functions:
            module, self.functions[key] = driver.load(cubin, lowered_name)
            self.modules.append(module)
        function = self.functions[key]
        driver.configure(function, launch)
        return function
