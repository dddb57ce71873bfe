"""The compiled call path: once a tunefw.Linear has met an input shape, each of its eager calls
is one C++ call (tunefw/runtime/fastpath.cpp) that checks the operands, allocates C, finds the
kernel's argument buffer and launches it, or runs F.linear's own ``at::linear`` for a cuBLAS
route; a Plan launches through the same code (``tunefw.gemm``).

Why: an eager model step is host-bound, and there every Python operation counts. In a patched
HF Llama on the H200 a tuned call cost 28 us in Plan.__call__ (15 of them in cuda-bindings'
launch) and 20 more in tunefw.Linear's checks, against 27 us for all of nn.Linear's call
(hf_eager_split_h200.json as of fae4f87): decode b64 ran 0.94x stock eagerly.

Built when a table is first set (tunefw.set_dispatch, $TUNEFW_DISPATCH) with
torch.utils.cpp_extension (a C++ compiler and ninja; about 20 s on two cores, once per source
and torch version, in ``$TUNEFW_CACHE_DIR/fastpath``, default
``~/.cache/tunefw/fastpath``). Off with ``TUNEFW_FASTPATH=0``, and wherever it cannot be built
(one warning): the Python path serves then, as it does for what the C++ path declines (new
shapes, grad to record, tensor subclasses, dispatch modes, programmatic launches,
operands a kernel cannot read, a launch the driver refuses).
"""
from __future__ import annotations

import hashlib
import itertools
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from tunefw.runtime.env import switch

ENV = "TUNEFW_FASTPATH"
SOURCE = Path(__file__).with_name("fastpath.cpp")
_state: dict[str, Any] = {"module": None, "tried": False, "serial": 0}
# route(routes, x, weight, bias) -> the layer's output or None: the built module's builtin, set
# when it is built (a module global, so a call pays no Python frame of ours)
route: Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor | None] | None = None
# launch(kernel, a, b) -> C = a @ b.T in a's leading shape, or None: likewise (Plan.__call__)
launch: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None
_serials: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # dispatcher -> its serial
_counter = itertools.count(1)
_lock = threading.Lock()


def enabled_by_env() -> bool:
    """False when $TUNEFW_FASTPATH turns the compiled path off (0, false, no, off)."""
    return switch(ENV)


def build_root() -> Path:
    """$TUNEFW_CACHE_DIR/fastpath, default ~/.cache/tunefw/fastpath."""
    from tunefw.cuda.compiler import cache_root

    return cache_root(None) / "fastpath"


def module() -> Any | None:
    """The compiled module (built on first use), or None where it is off or cannot be built."""
    global route, launch
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                _state["module"] = _build() if enabled_by_env() else None
                if _state["module"] is not None:
                    _state["module"].set_table(_state["serial"])
                    route, launch = _state["module"].route, _state["module"].launch
                _state["tried"] = True
    return _state["module"]


def _build() -> Any | None:
    try:
        from torch.utils import cpp_extension

        digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
        where = build_root() / digest
        where.mkdir(parents=True, exist_ok=True)
        return cpp_extension.load(name=f"tunefw_fastpath_{digest}", sources=[str(SOURCE)],
                                  build_directory=str(where), extra_cflags=["-O2"], verbose=False)
    except Exception as exc:  # no compiler, no ninja, other headers: the Python path serves
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        warnings.warn(f"tunefw: the compiled call path could not be built ({first[:200]}): "
                      f"tunefw.Linear and tunefw.gemm use their Python path", RuntimeWarning,
                      stacklevel=3)
        return None


def kernel(function: Any, geometry: Any, shape: tuple[int, int, int, int], device: int,
           dtype: torch.dtype, build_args: Callable[[int, int, int], tuple[int, Any]]) -> Any | None:
    """A compiled launcher of one kernel (``function``: its CUfunction; ``geometry``: its Launch,
    a cluster's launched by cuLaunchKernelEx; ``shape``: M, N, K and the weight's rows, 2N for a
    gated kernel), or None where the compiled path is off (the Python launch serves).
    ``build_args(a, b, c)`` gives the argument buffer of an operand address triple: (its
    address, what keeps it alive)."""
    mod = module()
    if mod is None:
        return None
    if not mod.has_launchers():
        from tunefw.cuda.driver import function_address

        plain, ex = function_address(b"cuLaunchKernel"), function_address(b"cuLaunchKernelEx")
        if plain is None or ex is None:
            return None
        mod.set_launchers(plain, ex)
    return mod.Kernel(int(function), tuple(geometry.grid), tuple(geometry.block),
                      tuple(geometry.cluster), geometry.smem_bytes, shape, device, dtype, build_args)


def routes() -> Any | None:
    """An empty route map for one layer (None where the compiled path is off)."""
    mod = module()
    return None if mod is None else mod.Routes()


def serve(dispatcher: Any) -> None:
    """Layers serve the routes they settled under ``dispatcher`` from now on (None: no table).
    Each dispatcher has its own serial, so switching tables and back keeps every layer's routes
    per table (a layer keeps four tables' routes). Setting a table builds (or loads) the
    compiled module, so that a serving model's first settled call does not wait for it."""
    serial = 0
    if dispatcher is not None:
        serial = _serials.get(dispatcher)
        if serial is None:
            serial = _serials[dispatcher] = next(_counter)
        module()  # set-up time: about 20 s the first time on two cores, then a load
    _state["serial"] = serial
    if _state["module"] is not None:
        _state["module"].set_table(serial)
