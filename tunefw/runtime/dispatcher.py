"""Runtime dispatch: C = A @ B^T from a dispatch table's tuned kernels, else cuBLAS.

``Dispatcher(path).gemm(a, b)`` takes a: MxK and b: NxK (TN, like ``F.linear`` without bias),
picks the entry for the shape by the table's rules on this GPU (tunefw/runtime/rules.py:
exact, bucket, nearest, calibration evidence, cuBLAS routes; then the first-call guard of
tunefw/runtime/guard.py for non-exact routes, unproven ones included: cuBLAS unless it times
their kernel faster), gets its kernel (compiled on first use through
tunefw.cuda.compiler and its cache, or read from a shipped cubin directory), verifies it strictly
on the shape's first use (tunefw/runtime/firstuse.py), launches it on torch's current stream and
returns C. Everything else goes to ``torch.matmul(a, b.t())``: cuBLAS routes, CPU tensors, other
dtypes, non-contiguous or misaligned operands, shapes no entry can serve, a table tuned on
another GPU model or compute capability, a SIMULATED table, a kernel that cannot be built or
that fails its verification on the shape.

The hot path (a cached plan per shape, a cached argument buffer per operand triple) is
tunefw/runtime/plan.py.

``gated(a, b, gate)`` serves a gated problem (b = [Bg; Bu]) the same way from the table's entries
of that gate, else in the stock form (one cuBLAS GEMM, then the gate's elementwise ops).
Shipped cubins (``cubin_dir``): tunefw/runtime/shipped.py.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.evaluate import method
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, load
from tunefw.runtime import firstuse
from tunefw.runtime import guard as guard_module
from tunefw.runtime.guard import Guard, Timer
from tunefw.runtime.plan import ALIGN, TORCH_DTYPES, DeviceState, Plan, programmatic_by_env
from tunefw.runtime.rules import Route, decide, shape as _shape
from tunefw.runtime.shipped import read_manifest
from tunefw.templates import FAMILIES


def dtype_name(dtype: str | torch.dtype) -> str:
    """'bf16' / 'fp16' for torch dtypes and names; other dtypes as torch spells them."""
    if isinstance(dtype, torch.dtype):
        return TORCH_DTYPES.get(dtype, str(dtype).removeprefix("torch."))
    return dtype


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


def _plan_key(a_shape: tuple, a: torch.Tensor, b: torch.Tensor, gate: str = "none") -> tuple:
    """A plan's cache key: both shapes, dtypes and devices (a plan exists only for operands on
    one device) and the gate. ``a_shape`` is a's 2-D shape, a torch.Size or the plain tuple it
    equals."""
    return (a_shape, b.shape, a.dtype, b.dtype, a.get_device(), b.get_device(), gate)


def _key(M: int, N: int, K: int, dtype: str, gate: str) -> str:
    """GemmProblem.key() of a runtime shape (layout TN), for shapes that may not be problems: what
    the verification records and the guard's untimed notes are keyed by."""
    return f"{M}x{N}x{K}:{dtype}:TN" + ("" if gate == "none" else f":{gate}")


def out_cols(b: torch.Tensor, gate: str) -> int:
    """C's width for a weight ``b``: its rows, half of them gated (b = [Bg; Bu])."""
    return b.shape[0] if gate == "none" else b.shape[0] // 2


class Dispatcher:
    """Serves ``gemm(a, b)`` from a dispatch table (see the module docstring for the rules)."""

    def __init__(self, path_or_table: str | Path | DispatchTable, *, cubin_dir: str | Path | None = None,
                 cache_dir: str | Path | None = None, gpu: DeviceSpec | None = None,
                 guard: bool | None = None, guard_timer: Timer | None = None,
                 guard_cache: str | Path | bool | None = None, verify: bool | None = None,
                 programmatic: bool | None = None) -> None:
        """``gpu`` stands in for the running GPU (its name, cc and limits); default: the driver's.
        ``guard``/``guard_timer``/``guard_cache``: the first-call guard (runtime/guard.py);
        ``verify``: each kernel's strict verification on each shape's first use
        (runtime/firstuse.py; default on unless $TUNEFW_VERIFY turns it off); ``programmatic``:
        programmatic launches of the families that allow them (runtime/plan.py; default off
        unless $TUNEFW_PDL turns it on)."""
        self.table = path_or_table if isinstance(path_or_table, DispatchTable) else load(path_or_table)
        self.cubin_dir = Path(cubin_dir) if cubin_dir else None
        self.cache_dir = cache_dir
        self._manifest = read_manifest(self.cubin_dir) if self.cubin_dir else None
        self._gpu = gpu
        self._lock = threading.RLock()
        self._plans: dict[tuple, Plan | None] = {}
        self._captured: dict[tuple, Plan | None] = {}  # plans first built during a capture
        self._routes: dict[tuple, Route] = {}
        self._devices: dict[int | None, DeviceState] = {}
        self._failed: dict[str, str] = {}  # name expression -> why its kernel is unavailable
        self._warned: set[str] = set()
        self._guard = Guard(self.table, guard, guard_timer, guard_cache)
        self._verify = firstuse.enabled_by_env() if verify is None else bool(verify)
        self._programmatic = programmatic_by_env() if programmatic is None else bool(programmatic)
        self._wrong: dict[tuple, str] = {}  # (shape key, device) -> why its kernel failed there
        self._unverified: dict[tuple, str] = {}  # (shape key, device) -> why it was not verified

    @property
    def programmatic(self) -> bool:
        """Whether the families that allow it are launched programmatically (runtime/plan.py)."""
        return self._programmatic

    # ---- the hot path ------------------------------------------------------------------------
    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """C = a @ b.T by the tuned kernel for the shape, else by cuBLAS (F.linear)."""
        key = _plan_key(a.shape, a, b)
        plan = self._plans.get(key, False)
        if plan is False:
            plan = self._resolve(key, a, b)
        c = plan(a, b) if plan is not None else None
        return torch.nn.functional.linear(a, b) if c is None else c  # a @ b.T, one dispatch

    def gated(self, a: torch.Tensor, b: torch.Tensor, gate: str = "silu") -> torch.Tensor:
        """C = silu(a @ Bg.T) * (a @ Bu.T) for b = [Bg; Bu] (2N x K) by a tuned gated kernel,
        else in the stock form (method.stock: one cuBLAS GEMM over b, then SiLU and the product)."""
        plan = self.plan_for(a, b, gate)
        c = plan(a, b) if plan is not None else None
        return stock_gated(a, b, gate) if c is None else c

    def route_for(self, a: torch.Tensor, b: torch.Tensor) -> Route:
        """The route gemm(a, b) takes for these very tensors (layout and placement included)."""
        if not (a.is_cuda and a.dim() == 2 and b.dim() == 2 and a.dtype == b.dtype):
            return Route("cublas", None, "not a 2-D CUDA GEMM of one dtype")
        route = self.route(a.shape[0], b.shape[0], a.shape[1], a.dtype, a.get_device())
        if route.candidate is not None:
            self.plan_for(a, b)  # built (and timed by the guard) on first use: the route after it
            route = self.route(a.shape[0], b.shape[0], a.shape[1], a.dtype, a.get_device())
        if route.entry is not None and not _servable(a, b):
            return Route("cublas", None, "operands are not contiguous, 16-byte aligned and on one device")
        return route

    def known_plan(self, x: torch.Tensor, b: torch.Tensor) -> Plan | None | bool:
        """The cached plan of x @ b.T for x of any rank (its rows flattened), or False where none
        is cached yet: what tunefw.Linear asks before it reshapes x (a torch.Size is a tuple, so
        (rows, K) finds the key plan_for stored)."""
        k = b.shape[1]
        return self._plans.get(_plan_key((x.numel() // k if k else 0, k), x, b), False)

    def plan_for(self, a: torch.Tensor, b: torch.Tensor, gate: str = "none") -> Plan | None:
        """The plan gemm(a, b) (gated: gated(a, b, gate)) uses (None: torch); built on first use."""
        key = _plan_key(a.shape, a, b, gate)
        plan = self._plans.get(key, False)
        return self._resolve(key, a, b, gate) if plan is False else plan

    # ---- choosing ----------------------------------------------------------------------------
    def _resolve(self, key: tuple, a: torch.Tensor, b: torch.Tensor, gate: str = "none") -> Plan | None:
        """Build (once, under the lock) the plan for a key; None means torch.matmul. A plan first
        built during CUDA-graph capture or tracing serves only captures: its workspace is zeroed
        when the graph replays, and its route was not timed, so eager calls build their own."""
        during = guard_module.capturing()  # looked up when called: tests stand in for it
        plans = self._captured if during and key not in self._plans else self._plans
        with self._lock:
            if key in plans:
                return plans[key]
            plan = None
            n, odd = out_cols(b, gate), gate != "none" and b.shape[0] % 2
            if a.is_cuda and a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1] \
                    and a.dtype == b.dtype and a.get_device() == b.get_device() and not odd:
                route = self.route(a.shape[0], n, a.shape[1], a.dtype, a.get_device(), gate)
                kernel = route.entry or self._measurable(route, a, b, gate)
                if kernel is not None:
                    dev = self._devices[a.get_device()]
                    plan = self._build(kernel, a.shape[0], n, a.shape[1], a.get_device())
                    if plan is not None:  # verified first: its launches load the kernel's module
                        plan = self._verified(plan, dev)  # outside the guard's timing
                    if plan is not None and _servable(a, b):
                        plan = self._first_call(route, plan, a, b, dev)
            plans[key] = plan
            return plan

    def _measurable(self, route: Route, a: torch.Tensor, b: torch.Tensor,
                    gate: str = "none") -> DispatchEntry | None:
        """The donor of an unproven route when the guard is to time it now (guard on, eager,
        operands a kernel can read), else None: the route stays cuBLAS."""
        if route.path != "unproven" or not _servable(a, b):
            return None
        problem = GemmProblem(a.shape[0], out_cols(b, gate), a.shape[1], dtype_name(a.dtype), gate=gate)
        return route.donor if self._guard.can_time(route, problem) else None

    def route(self, M: int, N: int, K: int, dtype: str | torch.dtype,
              device: int | None = None, gate: str = "none") -> Route:
        """Which path serves (M, N, K, dtype, gate) on CUDA device ``device`` (default: the
        current one); N is C's width (a gated problem's weight has 2N rows)."""
        name = dtype_name(dtype)
        with self._lock:
            dev = self._device(device)
            key = (M, N, K, name, dev.index if dev else None, gate)
            if key not in self._routes:
                self._routes[key] = self._route(M, N, K, name, dev, gate)
            route = self._routes[key]
            kernel = route.candidate
            if kernel is not None:
                reason = (self._failed.get(self._name(kernel))
                          or self._wrong.get((_key(M, N, K, name, gate), dev.index)))
                if reason:
                    return Route("cublas", None, f"the kernel of the {route.path} entry "
                                                 f"{_shape(kernel)} is unavailable: {reason}")
                route = self._guard.stored(route, GemmProblem(M, N, K, name, gate=gate), dev.spec)
            return route

    def _verified(self, plan: Plan, dev: DeviceState) -> Plan | None:
        """The plan once its kernel passed strict verification on its shape (runtime/firstuse.py),
        None when it failed (its shape then goes to cuBLAS, with one warning)."""
        if not self._verify:
            return plan
        where = (plan.problem.key(), dev.index)
        if guard_module.capturing():
            self._unverified[where] = ("first seen during CUDA-graph capture or torch.compile "
                                       "tracing: not verified")
            return plan
        from tunefw.cuda.driver import CudaFailure
        try:
            verdict = firstuse.verify_plan(plan, dev.spec)
            reason = None if verdict.ok else verdict.reason
        except (CudaFailure, torch.cuda.OutOfMemoryError) as exc:  # unverified: not served
            torch.cuda.empty_cache()
            reason = f"could not run: {str(exc).splitlines()[0]}"
        if reason is None:
            return plan
        self._wrong[where] = f"failed strict verification on this shape ({reason})"
        self._warn(f"tunefw: kernel {self._name(plan.entry)} failed strict verification on "
                   f"{where[0]} ({reason}): that shape uses cuBLAS")
        return None

    def _first_call(self, route: Route, plan: Plan, a: torch.Tensor, b: torch.Tensor,
                    dev: DeviceState) -> Plan | None:
        """The first-call guard on these operands: the plan, or None when cuBLAS was faster.
        Both sides write into outputs allocated before the timing (the kernel's argument buffer
        built too, Plan.prepared), so only launches are enqueued between the timing's events."""
        gate = plan.problem.gate
        c_ref = torch.empty(a.shape[0], out_cols(b, gate), dtype=a.dtype, device=a.device)
        bt = b.t()
        stock = (lambda: torch.matmul(a, bt, out=c_ref)) if gate == "none" \
            else (lambda: method.stock(a, b, gate, c_ref))
        decided = self._guard.first_call(route, plan.problem, dev.spec, plan.prepared(a, b), stock)
        return plan if decided.entry is not None else None

    def _route(self, M: int, N: int, K: int, dtype: str, dev: DeviceState | None,
               gate: str = "none") -> Route:
        if dev is None:
            return Route("cublas", None, "no CUDA device")
        if dev.refusal:
            return Route("cublas", None, dev.refusal)
        try:
            problem = GemmProblem(M, N, K, dtype, gate=gate)
        except UserError as exc:
            return Route("cublas", None, f"not a tunable problem: {exc}")
        return self._sourced(decide(self.table, problem, dev.spec, self._built_from(dev.spec.arch)))

    def explain(self, M: int, N: int, K: int, dtype: str | torch.dtype = "bf16",
                device: int | None = None, gate: str = "none") -> str:
        """One line: the path serving the shape (exact / bucket / nearest / calibrated / unproven /
        guarded / cublas), the rule, its entry and the measured ratio behind it."""
        with self._lock:
            live = self._device(device)
        name, gated = dtype_name(dtype), "" if gate == "none" else f" gate {gate}"
        if live is None:  # no CUDA here: what the table's rules answer on its own device
            route, note = self.preview(M, N, K, dtype, gate), f" [preview for {self._table_device()}]"
        else:
            route, note = self.route(M, N, K, dtype, device, gate), ""
            untimed = self._guard.untimed.get(_key(M, N, K, name, gate))
            note = f" [guard: {untimed}]" if untimed and route.path != "guarded" else ""
            unverified = self._unverified.get((_key(M, N, K, name, gate), live.index))
            note += f" [{unverified}]" if unverified and route.entry is not None else ""
        return f"{M}x{N}x{K} {name}{gated}: {route.path}: {route.reason}{note}"

    def preview(self, M: int, N: int, K: int, dtype: str | torch.dtype = "bf16",
                gate: str = "none") -> Route:
        """The route by the table's rules on the device it was tuned on (needs no CUDA)."""
        try:
            problem = GemmProblem(M, N, K, dtype_name(dtype), gate=gate)
        except UserError as exc:
            return Route("cublas", None, f"not a tunable problem: {exc}")
        return self._sourced(decide(self.table, problem,
                                    built_from=self._built_from(self.table.device().arch)))

    def _built_from(self, arch: str) -> Callable[[DispatchEntry], str | None]:
        """For decide(): the source a shipped cubin of the entry's kernel for ``arch`` was built
        from (its manifest's record), else None (built here from the installed templates)."""
        kernels = (self._manifest or {}).get("kernels", {}) \
            if (self._manifest or {}).get("arch") == arch else {}
        return lambda entry: (kernels.get(self._name(entry)) or {}).get("source_hash")

    def _sourced(self, route: Route) -> Route:
        """The route with where its kernel (an unproven route's donor's) comes from."""
        kernel = route.candidate
        return route if kernel is None else replace(route, reason=f"{route.reason}; {self._source(kernel)}")

    def _table_device(self) -> str:
        name = self.table.fingerprint.get("name") or self.table.device().name
        return f"{name}, the table's device" + (" (SIMULATED table)" if self.table.simulated else "")

    def _device(self, index: int | None) -> DeviceState | None:
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
            self._devices[index] = DeviceState(spec, refusal, index)
        return self._devices[index]

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    # ---- kernels -----------------------------------------------------------------------------
    @staticmethod
    def _name(entry: DispatchEntry) -> str:
        return FAMILIES[entry.family].name_expression(entry.config, entry.dtype, entry.gate)

    def _source(self, entry: DispatchEntry) -> str:
        """Where the entry's kernel comes from, in words."""
        name = self._name(entry)
        if self._manifest and name in self._manifest["kernels"]:
            return f"kernel {name} from {self.cubin_dir}"
        return f"kernel {name} compiled on first use"

    def _kernel(self, entry: DispatchEntry, arch: str) -> tuple[str, bytes, str, bool]:
        """(cache key, cubin, lowered name, whether it waits for the kernel before it) from the
        cubin directory (as its manifest says; unsaid: no), else from the compiler."""
        name = self._name(entry)
        shipped = (self._manifest or {}).get("kernels", {}).get(name)
        if shipped and self._manifest["arch"] == arch:
            return (shipped["file"], (self.cubin_dir / shipped["file"]).read_bytes(),
                    shipped["lowered_name"], shipped.get("programmatic") is True)
        from tunefw.cuda.compiler import compile_kernel
        family = FAMILIES[entry.family]
        result = compile_kernel(family, entry.config, entry.dtype, arch, cache_dir=self.cache_dir,
                                gate=entry.gate)
        if not result.ok:
            raise UserError(f"{result.status.value}: {(result.log.strip().splitlines() or [''])[0]}")
        return result.key, result.cubin, result.lowered_name, family.programmatic_launch

    def _build(self, entry: DispatchEntry, M: int, N: int, K: int, index: int) -> Plan | None:
        """Load or compile the entry's kernel for this shape; a failure sends it to cuBLAS."""
        from tunefw.cuda.driver import CudaFailure

        dev = self._devices[index]
        problem = GemmProblem(M, N, K, entry.dtype, gate=entry.gate)
        template = FAMILIES[entry.family]
        launch = template.launch(entry.config, problem, dev.spec)
        try:
            key, cubin, lowered, waits = self._kernel(entry, dev.spec.arch)
            function = dev.function(key, cubin, lowered, launch)
        except (UserError, CudaFailure, OSError) as exc:
            name = self._name(entry)
            self._failed[name] = str(exc)
            self._warn(f"tunefw: kernel {name} unavailable ({exc}): its shapes use cuBLAS")
            return None
        return Plan(template, entry, problem, launch, function, dev.context,
                    torch.device("cuda", index), programmatic=self._programmatic and waits)


def stock_gated(a: torch.Tensor, b: torch.Tensor, gate: str) -> torch.Tensor:
    """The gated GEMM in the stock form (method.stock), into a new C."""
    c = torch.empty(a.shape[0], out_cols(b, gate), dtype=a.dtype, device=a.device)
    method.stock(a, b, gate, c)
    return c


def _servable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Operands a kernel can read: contiguous, 16-byte aligned, on one device."""
    return (a.is_contiguous() and b.is_contiguous() and not (a.data_ptr() | b.data_ptr()) % ALIGN
            and a.get_device() == b.get_device())
