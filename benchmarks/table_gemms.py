"""A dispatch table's tuned kernels beside cuBLAS, as launches on shared inputs (GPU scripts).

For each kept entry: operands from method.make_inputs, the runtime's plan for them, and two
no-argument launches on torch's current stream, ``tunefw`` (the plan's raw launch into ``c``)
and ``cublas`` (torch.mm into ``c_ref``). Used by power_h200.py and profile_h200.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator


@dataclass
class TableGemm:
    entry: Any  # tunefw.runtime.dispatch.DispatchEntry
    tunefw: Callable[[], None]
    cublas: Callable[[], None]
    c: Any  # torch.Tensor: tunefw's output
    c_ref: Any  # torch.Tensor: cuBLAS's output

    @property
    def flops(self) -> float:
        return 2.0 * self.entry.M * self.entry.N * self.entry.K


def table_gemms(table_path: Path, keep: Callable[[Any], bool]) -> Iterator[TableGemm]:
    """The kept entries of the table that a tuned kernel serves on this GPU (others are named
    on stdout with the runtime's reason and skipped)."""
    import torch

    from tunefw.evaluate import method
    from tunefw.runtime.dispatch import load
    from tunefw.runtime.dispatcher import Dispatcher

    table = load(table_path)
    dispatcher = Dispatcher(table)
    for i, e in enumerate(table.entries):
        if not keep(e):
            continue
        a, b = method.make_inputs(e.M, e.N, e.K, e.dtype, i, device="cuda")
        plan = dispatcher.plan_for(a, b)
        if plan is None:
            print(f"{e.M}x{e.N}x{e.K}: no kernel ({dispatcher.explain(e.M, e.N, e.K)})")
            continue
        yield _pair(e, plan, a, b)


def _pair(entry: Any, plan: Any, a: Any, b: Any) -> TableGemm:
    """The two launches, bound to this entry's plan and tensors."""
    import torch

    c = torch.empty(entry.M, entry.N, dtype=a.dtype, device="cuda")
    c_ref = torch.empty_like(c)
    params = plan.args(a.data_ptr(), b.data_ptr(), c.data_ptr())
    stream = torch.cuda.current_stream().cuda_stream
    return TableGemm(entry, lambda: plan.launch(params, stream),
                     lambda: torch.mm(a, b.t(), out=c_ref), c, c_ref)
