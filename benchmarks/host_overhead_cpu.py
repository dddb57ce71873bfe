"""Host (Python) cost per call of the tunefw::gemm op and tunefw.Linear against nn.Linear, on CPU.

A fake dispatcher returns a preallocated C, so what is timed is the layers above the launch:
the op's registration (dispatcher keys, autograd wrapper, Python impl), ``tunefw.gemm`` and
``tunefw.Linear.forward``. The reference is ``nn.Linear`` / ``F.linear`` on a 1x8x8 problem
(its compute is a few ns, so its time is its host cost). On the meta device nothing computes at
all and tunefw.Linear takes its non-CPU path (the dispatcher's cached plan + bias add), the one
a GPU takes; there compare it with the fake plan alone and with ``Module.__call__`` of an
identity forward, the floor of any module call (nn.Linear and F.linear run Python meta kernels
there: no reference). Alternative registrations of the same op are built here in their own
namespace to compare them on one machine in one run:

- ``custom_op``: ``torch.library.custom_op`` + register_fake + register_autograd (tunefw before)
- ``library``: ``torch.library.Library`` define + CPU/CUDA impl + register_fake + register_autograd
- ``library_ad``: as ``library``, autograd as an ``autograd.Function`` on the Autograd key

    PYTHONPATH=. python3 benchmarks/host_overhead_cpu.py [--number 20000] [--out FILE.json]

Prints one line per case (best of 11 repeats, microseconds per call); with --out, writes JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tunefw  # noqa: E402
from tunefw.runtime import ops  # noqa: E402

M, N, K = 1, 8, 8
ALT: dict = {}
REPEAT = 11


class FakeDispatcher:
    """Returns one preallocated C: what is left is the host cost of the layers above it. Its
    plan (what tunefw.Linear calls on a non-CPU device, a kernel route) is cached for every
    shape, as the Dispatcher's is after a shape's first call."""

    def __init__(self, c: torch.Tensor) -> None:
        self.c = c

    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.c

    def plan(self, a: torch.Tensor, b: torch.Tensor, lead: tuple | None = None) -> torch.Tensor:
        return self.c

    def known_plan(self, x: torch.Tensor, b: torch.Tensor):
        return self.plan

    plan_for = known_plan


class Identity(torch.nn.Module):
    """The floor of any module call (nn.Linear's included): Module.__call__ around nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _alternatives(fake: FakeDispatcher) -> dict:
    """The same op registered three ways (namespace tunefw_hostbench)."""
    def impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fake.gemm(a, b)

    def fake_impl(a, b):
        return a.new_empty((*a.shape[:-1], b.shape[0]))

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return torch.matmul(grad, b), torch.matmul(grad.t(), a)

    custom = torch.library.custom_op("tunefw_hostbench::custom", impl, mutates_args=())
    custom.register_fake(fake_impl)
    custom.register_autograd(backward, setup_context=setup)

    lib = torch.library.Library("tunefw_hostbench", "FRAGMENT")
    lib.define("plain(Tensor a, Tensor b) -> Tensor")
    lib.define("plain_ad(Tensor a, Tensor b) -> Tensor")
    for key in ("CPU", "CUDA", "Meta"):
        lib.impl("plain", impl, key)
        lib.impl("plain_ad", impl, key)
    torch.library.register_fake("tunefw_hostbench::plain", fake_impl, lib=lib)
    torch.library.register_fake("tunefw_hostbench::plain_ad", fake_impl, lib=lib)
    torch.library.register_autograd("tunefw_hostbench::plain", backward, setup_context=setup, lib=lib)

    below = torch.ops.tunefw_hostbench.plain_ad.default
    setup_fn, backward_fn = setup, backward

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(a, b):
            with torch._C._AutoDispatchBelowAutograd():
                return below(a, b)

        setup_context = staticmethod(setup_fn)
        backward = staticmethod(backward_fn)

    def autograd_key(a, b):
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return Fn.apply(a, b)
        with torch._C._AutoDispatchBelowAutograd():
            return below(a, b)

    lib.impl("plain_ad", autograd_key, "Autograd")
    return {"custom_op": torch.ops.tunefw_hostbench.custom,
            "library": torch.ops.tunefw_hostbench.plain,
            "library_ad": torch.ops.tunefw_hostbench.plain_ad, "_lib": lib}


def _us(stmt, number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=REPEAT)) / number * 1e6


def measure(number: int) -> dict:
    """Microseconds per call of every case, per device (cpu, meta) and grad mode."""
    torch.manual_seed(0)
    saved = dict(ops._state)
    result: dict = {}
    try:
        for device in ("cpu", "meta"):
            x = torch.randn(M, K, device=device)
            x3 = x.reshape(1, M, K)  # (batch, tokens, K), as a transformers layer gets it
            identity = Identity()
            linear = torch.nn.Linear(K, N, device=device)
            fake = FakeDispatcher(torch.empty(M, N, device=device))
            ops._state.update(dispatcher=fake, env_read=True)
            alt = _alternatives(fake) if device == "cpu" else ALT
            ALT.update(alt)
            mine = tunefw.Linear.from_linear(linear)
            plain = torch.nn.Linear(K, N, bias=False, device=device)  # a transformers Llama's
            plain_mine = tunefw.Linear.from_linear(plain)
            w = linear.weight
            cases = {
                "nn.Linear": lambda: linear(x),
                "F.linear": lambda: F.linear(x, w, linear.bias),
                "torch.matmul(a, b.t())": lambda: torch.matmul(x, w.t()),
                "fake dispatcher.gemm": lambda: fake.gemm(x, w),
                "torch.ops.tunefw.gemm": lambda: torch.ops.tunefw.gemm(x, w),
                "tunefw.gemm": lambda: tunefw.gemm(x, w),
                "tunefw.Linear": lambda: mine(x),
                "nn.Linear, 3-D input, no bias": lambda: plain(x3),
                "tunefw.Linear, 3-D input, no bias": lambda: plain_mine(x3),
                "fake plan": lambda: fake.plan(x3, w, (1, M)),
                "Module.__call__ of an identity forward": lambda: identity(x),
                "op registered by custom_op": lambda: ALT["custom_op"](x, w),
                "op registered by Library.impl": lambda: ALT["library"](x, w),
                "op registered by Library.impl + Autograd key": lambda: ALT["library_ad"](x, w),
            }
            for mode in ("no_grad", "grad"):
                with torch.set_grad_enabled(mode == "grad"):
                    result[f"{device}/{mode}"] = {name: round(_us(fn, number), 3)
                                                  for name, fn in cases.items()}
        return result
    finally:
        ops._state.clear()
        ops._state.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000, help="calls per repeat")
    parser.add_argument("--out", type=Path, help="also write the numbers here (JSON)")
    args = parser.parse_args()
    result = measure(args.number)
    for mode, cases in result.items():
        print(f"[{mode}] us per call (best of {REPEAT} x {args.number}), {M}x{N}x{K} fp32")
        for name, us in cases.items():
            print(f"  {name:48s} {us:8.2f}")
    if args.out:
        meta = {"torch": torch.__version__, "python": platform.python_version(),
                "machine": platform.processor() or platform.machine(), "shape": [M, N, K],
                "number": args.number}
        args.out.write_text(json.dumps({"meta": meta, "us_per_call": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
