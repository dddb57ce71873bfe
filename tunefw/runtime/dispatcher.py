"""Runtime dispatch: C = A @ B^T from a dispatch table's tuned kernels, else cuBLAS.

``Dispatcher(path).gemm(a, b)`` takes a: MxK and b: NxK (TN, like ``F.linear`` without bias),
picks the entry for the shape by the table's rules on this GPU (tunefw/runtime/rules.py:
exact, bucket, nearest, calibration evidence, cuBLAS routes; then the first-call guard of
tunefw/runtime/guard.py for non-exact routes), gets its kernel (compiled on first use through
tunefw.compiler and its cache, or read from a shipped cubin directory), launches it on torch's
current stream and returns C. Everything else goes to ``torch.matmul(a, b.t())``: cuBLAS
routes, CPU tensors, other dtypes, non-contiguous or misaligned operands, shapes no entry can
serve, a table tuned on another GPU model or compute capability, a SIMULATED table, a kernel
that cannot be built.

Hot path: per (shape, dtype, device) the chosen plan is cached; per plan the kernel argument
buffer (cuLaunchKernel's ``void**``) is cached per (a, b, c) address triple, so a call costs
the output allocation (torch's caching allocator), the operands' alignment and contiguity
checks, a few dict lookups and the launch. The split-K workspace is allocated and zeroed once
per plan (the kernels reset their own counters), so after the first call of a shape a call
allocates only C and never synchronizes: it can be captured in a CUDA graph. One plan's
workspace is shared: do not run the same split-K shape concurrently on two streams.

Shipped cubins (``cubin_dir``), as written by :func:`ship_cubins`::

    cubin_dir/manifest.json  {"format": 1, "arch": "sm_90a",
                              "kernels": {"<name expression>": {"file": "<cache key>.cubin",
                                                                "lowered_name": "<mangled>"}}}
    cubin_dir/<cache key>.cubin

The name expression (e.g. ``gemm_wgmma_sm90<0, 128, ...>``) names the instantiation; a cubin is
used only when the manifest's arch equals this GPU's; a kernel missing from the manifest is
compiled (and a compile that fails sends its shapes to cuBLAS).
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, load
from tunefw.runtime.guard import Guard, Timer
from tunefw.runtime.rules import Route, shape as _shape
from tunefw.runtime.shipped import read_manifest
from tunefw.templates import FAMILIES
from tunefw.templates.base import KernelTemplate, Launch

ARG_SETS_KEPT = 4096  # argument buffers cached per plan (distinct a, b, c address triples)
TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
ALIGN = 16  # bytes: cp.async and TMA need 16-byte aligned operand rows


def dtype_name(dtype: str | torch.dtype) -> str:
    """'bf16' / 'fp16' for torch dtypes and names; other dtypes as torch spells them."""
    if isinstance(dtype, torch.dtype):
        return TORCH_DTYPES.get(dtype, str(dtype).removeprefix("torch."))
    return dtype


def _raw_stream_getter():
    """A fast current-stream function (index -> cudaStream_t as int)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw or (lambda index: torch.cuda.current_stream(index).cuda_stream)


_current_stream = _raw_stream_getter()


def live_spec(index: int) -> DeviceSpec:
    """The limits of CUDA device ``index`` as the driver reports them."""
    from tunefw.cuda import driver

    major, minor = torch.cuda.get_device_capability(index)
    return driver.device_spec(driver.device(index), torch.cuda.get_device_name(index),
                              major * 10 + minor)


def fingerprint_mismatch(table: DispatchTable, gpu: DeviceSpec) -> str | None:
    """Why the table's kernels must not run on ``gpu`` (SIMULATED, other model or arch), or None."""
    if table.simulated:
        return "the dispatch table is SIMULATED (tuned on a modeled device)"
    fps = table.fingerprint.get("mixed") or [table.fingerprint]
    for fp in fps:
        name, cc = fp.get("name"), fp.get("cc")
        if (name, cc) != (gpu.name, gpu.cc):
            return f"the dispatch table was tuned on {name} (cc {cc}), this GPU is {gpu.name} (cc {gpu.cc})"
    return None


def _pack(args: list[tuple[Any, Any]]) -> tuple[int, tuple]:
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


class _Plan:
    """One (entry, shape, device): the loaded kernel, its geometry, workspace and argument buffers."""

    def __init__(self, template: KernelTemplate, entry: DispatchEntry, problem: GemmProblem,
                 launch: Launch, function: Any, context: Any, device: torch.device) -> None:
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
        self._ws_ptr = self.workspace.data_ptr() if self.workspace is not None else 0
        self._args: dict[tuple[int, int, int], tuple[int, tuple]] = {}
        self._dims = (*launch.grid, *launch.block, launch.smem_bytes)
        self._configs: dict[int, Any] = {}  # cluster launches: CUlaunchConfig per stream

    def args(self, a_ptr: int, b_ptr: int, c_ptr: int) -> int:
        """The argument buffer's address for these operands (built once per address triple)."""
        key = (a_ptr, b_ptr, c_ptr)
        packed = self._args.get(key)
        if packed is None:
            ptrs = {"a": a_ptr, "b": b_ptr, "c": c_ptr, "workspace": self._ws_ptr}
            packed = _pack(self.template.kernel_args(self.entry.config, self.problem, ptrs))
            if len(self._args) >= ARG_SETS_KEPT:
                self._args.clear()
            self._args[key] = packed
        return packed[0]

    def _cluster_config(self, stream: int) -> Any:
        config = self._configs.get(stream)
        if config is None:
            config = self._configs[stream] = self._driver.cluster_config(self.launch_geometry, stream)
        return config

    def launch(self, params: int, stream: int) -> None:
        """The raw launch: one kernel on ``stream`` with a prepared argument buffer."""
        if self.launch_geometry.cluster == (1, 1, 1):
            (err,) = self._cu.cuLaunchKernel(self.function, *self._dims, stream, params, 0)
        else:
            (err,) = self._cu.cuLaunchKernelEx(self._cluster_config(stream), self.function, params, 0)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            self._retry(err, params, stream)

    def _retry(self, err: Any, params: int, stream: int) -> None:
        """A thread without this device's context current: set it and launch again, once."""
        d = self._driver
        if err in d.NO_CONTEXT_ERRORS:
            d.set_current(self.context)
            err = d.launch_raw(self.function, self.launch_geometry, params, stream,
                               self._cluster_config(stream) if self.launch_geometry.cluster != (1, 1, 1) else None)
        if err != d.E.CUDA_SUCCESS:
            raise d.CudaFailure(err, "launch", f"tunefw {self.entry.family} kernel for "
                                               f"{self.problem.key()}")

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        """C for operands of this plan's shape, or None when the kernel cannot read them
        (misaligned or not contiguous): the caller then uses torch.matmul."""
        a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
        if (a_ptr | b_ptr) % ALIGN or not (a.is_contiguous() and b.is_contiguous()):
            return None
        # Sizes as separate ints: parsing them costs less than a shape tuple, on the hot path.
        c = torch.empty(self._m, self._n, dtype=self._out_dtype, device=self._device)
        c_ptr = c.data_ptr()
        packed = self._args.get((a_ptr, b_ptr, c_ptr))
        params = packed[0] if packed is not None else self.args(a_ptr, b_ptr, c_ptr)
        self.launch(params, _current_stream(self.index))
        return c


class _Device:
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


class Dispatcher:
    """Serves ``gemm(a, b)`` from a dispatch table (see the module docstring for the rules)."""

    def __init__(self, path_or_table: str | Path | DispatchTable, *, cubin_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None, gpu: DeviceSpec | None = None,
                 guard: bool | None = None, guard_timer: Timer | None = None,
                 guard_cache: str | Path | bool | None = None) -> None:
        """``gpu`` stands in for the running GPU (its name, cc and limits); default: the driver's.
        ``guard``/``guard_timer``/``guard_cache``: the first-call guard (runtime/guard.py)."""
        self.table = path_or_table if isinstance(path_or_table, DispatchTable) else load(path_or_table)
        self.cubin_dir = Path(cubin_dir) if cubin_dir else None
        self.cache_dir = cache_dir
        self._manifest = read_manifest(self.cubin_dir) if self.cubin_dir else None
        self._gpu = gpu
        self._lock = threading.RLock()
        self._plans: dict[tuple, _Plan | None] = {}
        self._routes: dict[tuple, Route] = {}
        self._devices: dict[int | None, _Device] = {}
        self._failed: dict[str, str] = {}  # name expression -> why its kernel is unavailable
        self._warned: set[str] = set()
        self._guard = Guard(self.table, guard, guard_timer, guard_cache)

    # ---- the hot path ------------------------------------------------------------------------
    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """C = a @ b.T by the tuned kernel for the shape, else torch.matmul(a, b.t())."""
        # The key holds both devices, so a plan exists only for operands on one device.
        key = (a.shape, b.shape, a.dtype, b.dtype, a.get_device(), b.get_device())
        plan = self._plans.get(key, False)
        if plan is False:
            plan = self._resolve(key, a, b)
        c = plan(a, b) if plan is not None else None
        return torch.matmul(a, b.t()) if c is None else c

    def route_for(self, a: torch.Tensor, b: torch.Tensor) -> Route:
        """The route gemm(a, b) takes for these very tensors (layout and placement included)."""
        if not (a.is_cuda and a.dim() == 2 and b.dim() == 2 and a.dtype == b.dtype):
            return Route("cublas", None, "not a 2-D CUDA GEMM of one dtype")
        route = self.route(a.shape[0], b.shape[0], a.shape[1], a.dtype, a.get_device())
        if route.entry is not None and self.plan_for(a, b) is None:  # its kernel failed to build
            route = self.route(a.shape[0], b.shape[0], a.shape[1], a.dtype, a.get_device())
        if route.entry is not None and not _servable(a, b):
            return Route("cublas", None, "operands are not contiguous, 16-byte aligned and on one device")
        return route

    def plan_for(self, a: torch.Tensor, b: torch.Tensor) -> _Plan | None:
        """The plan gemm(a, b) uses (None: torch.matmul); builds it on first use."""
        key = (a.shape, b.shape, a.dtype, b.dtype, a.get_device(), b.get_device())
        plan = self._plans.get(key, False)
        return self._resolve(key, a, b) if plan is False else plan

    # ---- choosing ----------------------------------------------------------------------------
    def _resolve(self, key: tuple, a: torch.Tensor, b: torch.Tensor) -> _Plan | None:
        """Build (once, under the lock) the plan for a key; None means torch.matmul."""
        with self._lock:
            if key in self._plans:
                return self._plans[key]
            plan = None
            if a.is_cuda and a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1] \
                    and a.dtype == b.dtype and a.get_device() == b.get_device():
                route = self.route(a.shape[0], b.shape[0], a.shape[1], a.dtype, a.get_device())
                if route.entry is not None:
                    plan = self._build(route.entry, a.shape[0], b.shape[0], a.shape[1], a.get_device())
                    if plan is not None and _servable(a, b):
                        plan = self._first_call(route, plan, a, b, self._devices[a.get_device()])
            self._plans[key] = plan
            return plan

    def route(self, M: int, N: int, K: int, dtype: str | torch.dtype,
              device: int | None = None) -> Route:
        """Which path serves (M, N, K, dtype) on CUDA device ``device`` (default: the current one)."""
        name = dtype_name(dtype)
        with self._lock:
            dev = self._device(device)
            key = (M, N, K, name, dev.index if dev else None)
            if key not in self._routes:
                self._routes[key] = self._route(M, N, K, name, dev)
            route = self._routes[key]
            if route.entry is not None:
                reason = self._failed.get(self._name(route.entry))
                if reason:
                    return Route("cublas", None, f"the kernel of the {route.path} entry "
                                                 f"{_shape(route.entry)} is unavailable: {reason}")
                route = self._guard.stored(route, GemmProblem(M, N, K, name), dev.spec)
            return route

    def _first_call(self, route: Route, plan: _Plan, a: torch.Tensor, b: torch.Tensor,
                    dev: _Device) -> _Plan | None:
        """The first-call guard on these operands: the plan, or None when cuBLAS was faster."""
        decided = self._guard.first_call(route, plan.problem, dev.spec, lambda: plan(a, b),
                                         lambda: torch.matmul(a, b.t()))
        return plan if decided.entry is not None else None

    def _route(self, M: int, N: int, K: int, dtype: str, dev: _Device | None) -> Route:
        if dev is None:
            return Route("cublas", None, "no CUDA device")
        if dev.refusal:
            return Route("cublas", None, dev.refusal)
        try:
            problem = GemmProblem(M, N, K, dtype)
        except UserError as exc:
            return Route("cublas", None, f"not a tunable problem: {exc}")
        route = self.table.decide(problem, dev.spec)
        if route.entry is None:
            return route
        return replace(route, reason=f"{route.reason}; {self._source(route.entry)}")

    def explain(self, M: int, N: int, K: int, dtype: str | torch.dtype = "bf16",
                device: int | None = None) -> str:
        """One line: the path serving the shape (exact / bucket / nearest / calibrated / cublas),
        the rule, its entry and the measured ratio behind it."""
        with self._lock:
            live = self._device(device)
        if live is None:  # no CUDA here: what the table's rules answer on its own device
            route, note = self.preview(M, N, K, dtype), f" [preview for {self._table_device()}]"
        else:
            route, note = self.route(M, N, K, dtype, device), ""
            untimed = self._guard.untimed.get(f"{M}x{N}x{K}:{dtype_name(dtype)}:TN")
            note = f" [guard: {untimed}]" if untimed and route.path != "guarded" else ""
        return f"{M}x{N}x{K} {dtype_name(dtype)}: {route.path}: {route.reason}{note}"

    def preview(self, M: int, N: int, K: int, dtype: str | torch.dtype = "bf16") -> Route:
        """The route by the table's rules on the device it was tuned on (needs no CUDA)."""
        try:
            problem = GemmProblem(M, N, K, dtype_name(dtype))
        except UserError as exc:
            return Route("cublas", None, f"not a tunable problem: {exc}")
        route = self.table.decide(problem)
        if route.entry is None:
            return route
        return replace(route, reason=f"{route.reason}; {self._source(route.entry)}")

    def _table_device(self) -> str:
        name = self.table.fingerprint.get("name") or self.table.device().name
        return f"{name}, the table's device" + (" (SIMULATED table)" if self.table.simulated else "")

    def _device(self, index: int | None) -> _Device | None:
        """The device state (probed once; warns once when the table must not run there)."""
        if index is None or index < 0:
            if self._gpu is None and not torch.cuda.is_available():
                return None
            index = torch.cuda.current_device() if torch.cuda.is_available() else None
        if index not in self._devices:
            spec = self._gpu or live_spec(index)
            refusal = fingerprint_mismatch(self.table, spec)
            if refusal:
                self._warn(f"tunefw: {refusal}: every GEMM uses cuBLAS (torch.matmul)")
            self._devices[index] = _Device(spec, refusal, index)
        return self._devices[index]

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    # ---- kernels -----------------------------------------------------------------------------
    @staticmethod
    def _name(entry: DispatchEntry) -> str:
        return FAMILIES[entry.family].name_expression(entry.config, entry.dtype)

    def _source(self, entry: DispatchEntry) -> str:
        """Where the entry's kernel comes from, in words."""
        name = self._name(entry)
        if self._manifest and name in self._manifest["kernels"]:
            return f"kernel {name} from {self.cubin_dir}"
        return f"kernel {name} compiled on first use"

    def _kernel(self, entry: DispatchEntry, arch: str) -> tuple[str, bytes, str]:
        """(cache key, cubin, lowered name) from the cubin directory, else from the compiler."""
        name = self._name(entry)
        shipped = (self._manifest or {}).get("kernels", {}).get(name)
        if shipped and self._manifest["arch"] == arch:
            return shipped["file"], (self.cubin_dir / shipped["file"]).read_bytes(), shipped["lowered_name"]
        from tunefw.compiler import compile_kernel
        result = compile_kernel(FAMILIES[entry.family], entry.config, entry.dtype, arch,
                                cache_dir=self.cache_dir)
        if not result.ok:
            raise UserError(f"{result.status.value}: {(result.log.strip().splitlines() or [''])[0]}")
        return result.key, result.cubin, result.lowered_name

    def _build(self, entry: DispatchEntry, M: int, N: int, K: int, index: int) -> _Plan | None:
        """Load or compile the entry's kernel for this shape; a failure sends it to cuBLAS."""
        from tunefw.cuda.driver import CudaFailure

        dev = self._devices[index]
        problem = GemmProblem(M, N, K, entry.dtype)
        template = FAMILIES[entry.family]
        launch = template.launch(entry.config, problem, dev.spec)
        try:
            key, cubin, lowered = self._kernel(entry, dev.spec.arch)
            function = dev.function(key, cubin, lowered, launch)
        except (UserError, CudaFailure, OSError) as exc:
            name = self._name(entry)
            self._failed[name] = str(exc)
            self._warn(f"tunefw: kernel {name} unavailable ({exc}): its shapes use cuBLAS")
            return None
        return _Plan(template, entry, problem, launch, function, dev.context,
                     torch.device("cuda", index))


def _servable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Operands a kernel can read: contiguous, 16-byte aligned, on one device."""
    return (a.is_contiguous() and b.is_contiguous() and not (a.data_ptr() | b.data_ptr()) % ALIGN
            and a.get_device() == b.get_device())
