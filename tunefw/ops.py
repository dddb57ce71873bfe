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
from pathlib import Path

import torch

from tunefw.dispatch import DispatchTable
from tunefw.runtime import Dispatcher

ENV = "TUNEFW_DISPATCH"
_state: dict = {"dispatcher": None, "env_read": False}
_lock = threading.Lock()


def set_dispatch(path_or_table: str | Path | DispatchTable | None, **options) -> Dispatcher | None:
    """Make the table the one tunefw::gemm serves from (None: back to torch.matmul)."""
    dispatcher = Dispatcher(path_or_table, **options) if path_or_table is not None else None
    with _lock:
        _state["dispatcher"], _state["env_read"] = dispatcher, True
    return dispatcher


def get_dispatcher() -> Dispatcher | None:
    """The process-global Dispatcher (read from $TUNEFW_DISPATCH the first time), or None."""
    if not _state["env_read"]:
        with _lock:
            if not _state["env_read"]:
                path = os.environ.get(ENV)
                _state["dispatcher"] = Dispatcher(path) if path else None
                _state["env_read"] = True
                if not path:
                    warnings.warn(f"tunefw: no dispatch table set (tunefw.set_dispatch(path) or "
                                  f"${ENV}): tunefw::gemm uses torch.matmul", RuntimeWarning,
                                  stacklevel=3)
    return _state["dispatcher"]


@torch.library.custom_op("tunefw::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dispatcher = get_dispatcher()
    return dispatcher.gemm(a, b) if dispatcher is not None else torch.matmul(a, b.t())


@_gemm_op.register_fake
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


_gemm_op.register_autograd(_backward, setup_context=_setup_context)


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = a @ b.T (a: MxK, b: NxK) through the tunefw::gemm op."""
    return torch.ops.tunefw.gemm(a, b)


class Linear(torch.nn.Linear):
    """``nn.Linear`` whose matmul is tunefw::gemm; the bias is added after (no family fuses it yet)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.tunefw.gemm(x.reshape(-1, x.shape[-1]), self.weight)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y + self.bias if self.bias is not None else y

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "Linear":
        """A tunefw.Linear sharing ``linear``'s parameters."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        return new
