"""Torch integration: the ``tunefw::gemm`` custom op, ``tunefw.gemm`` and ``tunefw.Linear``.

The op serves C = a @ b.T through a process-global Dispatcher: ``set_dispatch(path)``, or the
file named by $TUNEFW_DISPATCH on first use. Without either, every call uses torch.matmul (one
warning). The op has a fake implementation (torch.compile traces it) and an autograd formula
(the backward GEMMs use torch.matmul), so ``tunefw.Linear`` can replace ``nn.Linear`` anywhere.
"""
from __future__ import annotations

import os
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch

from tunefw.errors import UserError
from tunefw.problem import GATES
from tunefw.runtime import fastpath
from tunefw.runtime.dispatch import DispatchTable
from tunefw.runtime.dispatcher import Dispatcher
from tunefw.runtime.plan import Plan

ENV = "TUNEFW_DISPATCH"
_state: dict = {"dispatcher": None, "env_read": False}
_lock = threading.Lock()


def set_dispatch(path_or_table: str | Path | DispatchTable | Dispatcher | None,
                 **options) -> Dispatcher | None:
    """Make the table (or Dispatcher) the one tunefw::gemm serves from (None: torch.matmul)."""
    if isinstance(path_or_table, Dispatcher) or path_or_table is None:
        dispatcher = path_or_table
    else:
        dispatcher = Dispatcher(path_or_table, **options)
    with _lock:
        _state["dispatcher"], _state["env_read"] = dispatcher, True
        fastpath.serve(dispatcher)  # layers serve the compiled routes settled under this one
    return dispatcher


def get_dispatcher() -> Dispatcher | None:
    """The process-global Dispatcher (read from $TUNEFW_DISPATCH the first time), or None."""
    if not _state["env_read"]:
        with _lock:
            if not _state["env_read"]:
                path = os.environ.get(ENV)
                _state["dispatcher"] = Dispatcher(path) if path else None
                fastpath.serve(_state["dispatcher"])
                _state["env_read"] = True
                if not path:
                    warnings.warn(f"tunefw: no dispatch table set (tunefw.set_dispatch(path) or "
                                  f"${ENV}): tunefw::gemm uses torch.matmul", RuntimeWarning,
                                  stacklevel=3)
    return _state["dispatcher"]


def _gemm_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dispatcher = _state["dispatcher"] if _state["env_read"] else get_dispatcher()
    return dispatcher.gemm(a, b) if dispatcher is not None else torch.matmul(a, b.t())


def _gemm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch._check(a.shape[-1] == b.shape[-1], lambda: "tunefw::gemm: a and b differ in K")
    return a.new_empty((*a.shape[:-1], b.shape[0]))


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor):
    a, b = ctx.saved_tensors
    grad_a = torch.matmul(grad, b) if ctx.needs_input_grad[0] else None
    grad_b = (torch.matmul(grad.reshape(-1, grad.shape[-1]).t(), a.reshape(-1, a.shape[-1]))
              if ctx.needs_input_grad[1] else None)
    return grad_a, grad_b


# A plain torch.library registration: one Python kernel for every backend, a fake kernel for
# torch.compile, an autograd formula. On CPU it cost 1.5-1.9x less host time per call than
# torch.library.custom_op without grad and the same with it (benchmarks/host_overhead_cpu.py).
_LIB = torch.library.Library("tunefw", "DEF")
_LIB.define("gemm(Tensor a, Tensor b) -> Tensor")
_LIB.impl("gemm", _gemm_impl, "CompositeExplicitAutograd")  # every backend; Meta: the fake
torch.library.register_fake("tunefw::gemm", _gemm_fake, lib=_LIB)
torch.library.register_autograd("tunefw::gemm", _backward, setup_context=_setup_context, lib=_LIB)
_GEMM = torch.ops.tunefw.gemm.default
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_Tensor, _Parameter = torch.Tensor, torch.nn.Parameter


def _eager(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether a call may skip the op: eager, plain tensors, no dispatch mode active."""
    return (not _is_compiling() and type(x) is _Tensor
            and (type(w) is _Parameter or type(w) is _Tensor) and not _dispatch_modes())


def _records_grad(x: torch.Tensor, w: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = a @ b.T (a: MxK, b: NxK) through the tunefw::gemm op (eager without grad: its kernel)."""
    if _eager(a, b) and not _records_grad(a, b):
        return _gemm_impl(a, b)
    return _GEMM(a, b)


def gated(x: torch.Tensor, w: torch.Tensor, gate: str = "silu") -> torch.Tensor:
    """silu(x @ Wg.T) * (x @ Wu.T) for w = [Wg; Wu] (2N x K) and x of any rank (..., K): a
    SwiGLU MLP's gate and up projections as one gated GEMM. Eager CUDA calls that record no grad
    go to the dispatcher (a tuned gated kernel, else the stock form); everything else (autograd,
    torch.compile, CPU) runs the stock form in torch ops: one GEMM over w, SiLU, the product."""
    if gate not in GATES or gate == "none":
        raise UserError(f"tunefw.gated: gate={gate!r}: expected one of {', '.join(GATES[1:])}")
    if w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != x.shape[-1]:
        raise UserError(f"tunefw.gated: w of shape {tuple(w.shape)}: expected [Wg; Wu] of 2N x "
                        f"{x.shape[-1]} (x's last dimension)")
    if x.is_cuda and _eager(x, w) and not _records_grad(x, w):
        dispatcher = _state["dispatcher"] if _state["env_read"] else get_dispatcher()
        if dispatcher is not None:
            y = dispatcher.gated(x.reshape(-1, x.shape[-1]), w, gate)
            return y.view(*x.shape[:-1], y.shape[-1])
    g, u = _linear(x, w).chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u


class Linear(torch.nn.Linear):
    """``nn.Linear`` whose matmul is tunefw::gemm; the bias is added after (no family fuses it yet).

    Eager calls skip the op layer: CPU tensors (and every tensor without a table) go to
    ``F.linear``, exactly as ``nn.Linear``; other tensors that record no grad go straight to the
    dispatcher's plan (cached per shape, dtype and device; the kernel reads a 3-D input's rows
    and writes C in its shape, no reshape either side), and a shape it routes to cuBLAS to
    ``F.linear`` again, bias fused (hf_llama_before_route_fix_h200.json measured the
    dispatcher's matmul + separate bias add at 0.92-0.98x of stock in eager decode).
    Once a shape's route is settled, the layer remembers it: in its compiled route map
    (tunefw/runtime/fastpath.py: its next eager calls are one C++ call, checks, allocation and
    launch or ``at::linear``), else, for cuBLAS routes, in a Python memo of (shape, dtype). The
    H200 measured the Python path's tuned calls at 48 us of host time against 27 us for
    ``nn.Linear`` (hf_eager_split_h200.json as of fae4f87; fastpath_check_h200.json: 10.6 us on
    the compiled path against 22.4 for F.linear). Under torch.compile, a dispatch mode, or with grad
    to record on a GPU, the op is called.
    """

    _cublas: tuple | None = None  # (weakref to a dispatcher, {(x.shape, x.dtype)} it sent to cuBLAS)
    _fast: Any = None  # the compiled route map (fastpath.routes()), made on the first settled route

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = self._parameters  # as nn.Linear registers them: no Module.__getattr__ per call
        w, bias = ((params["weight"], params["bias"]) if "weight" in params and "bias" in params
                   else (self.weight, self.bias))
        if not _is_compiling():
            fast = self._fast
            if fast is not None:  # settled routes: one C++ call
                y = fastpath.route(fast, x, w, bias)
                if y is not None:
                    return y
            known = self._cublas
            if known is not None and known[0]() is _state["dispatcher"] \
                    and (x.shape, x.dtype) in known[1]:
                return _linear(x, w, bias)
        if _eager(x, w):
            dispatcher = _state["dispatcher"] if _state["env_read"] else get_dispatcher()
            if dispatcher is None or x.is_cpu:  # what the dispatcher would do, bias fused
                return _linear(x, w, bias)
            if not _records_grad(x, w):
                plan = dispatcher.known_plan(x, w)  # by x's rows: no reshape to ask
                if plan is False:  # the shape's first call: the route is resolved on 2-D rows
                    plan = dispatcher.plan_for(x if x.dim() == 2 else x.reshape(-1, x.shape[-1]), w)
                else:  # a route settled eagerly (not one made in capture): remembered
                    self._remember(dispatcher, x, plan)
                # the kernel reads x's rows and writes C in x's leading shape: no reshapes
                y = None if plan is None else plan(x, w) if x.dim() == 2 else plan(x, w, x.shape[:-1])
                if y is None:  # a cuBLAS route: nn.Linear's own call, bias fused by cuBLAS
                    return _linear(x, w, bias)
                if bias is not None:
                    y.add_(bias)  # the kernel's C is a fresh tensor: add in place
                return y
        y = _GEMM(x.reshape(-1, x.shape[-1]), w)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y + bias if bias is not None else y

    def _remember(self, dispatcher: Dispatcher, x: torch.Tensor, plan: Plan | None) -> None:
        """Store x's settled route: in the compiled route map where there is one (a cuBLAS route
        or a plan with a compiled launcher), else a cuBLAS route in the Python memo."""
        fast = self._fast
        if fast is None:
            fast = self._fast = fastpath.routes()
        if fast is None:  # the compiled path is off
            if plan is None:
                known = self._cublas
                if known is None or known[0]() is not dispatcher:
                    known = self._cublas = (weakref.ref(dispatcher), set())
                known[1].add((x.shape, x.dtype))
        elif plan is None:
            fast.set_cublas(x)
        elif plan.fast is not None:  # (a programmatic plan has none: its calls stay in Python)
            fast.set_kernel(x, plan.fast)

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without its routes (they name this process's dispatcher and
        kernels)."""
        state = super().__getstate__()
        state.pop("_cublas", None)
        state.pop("_fast", None)
        return state

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "Linear":
        """A tunefw.Linear sharing ``linear``'s parameters."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        # registered as nn.Linear registers them, a missing bias as a None entry: forward reads
        # both from _parameters (a plain `new.bias = None` would make bias an instance attribute,
        # and every call would fall back to Module.__getattr__ for the weight)
        new.register_parameter("weight", linear.weight)
        new.register_parameter("bias", linear.bias)
        return new


_linear = torch.nn.functional.linear
