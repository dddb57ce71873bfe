"""Strict verification, the one check every trial, confirmation, `tunefw verify` and the runtime's
first use of a kernel on a shape (runtime/firstuse.py) run.

Beyond method.verify's values (no NaN/Inf, fp32 reference globally and per row, bounded by
cuBLAS's own error), a config must:
- write nothing outside C: C lies between two guard bands of a NaN sentinel bit pattern that
  must be intact after every launch;
- leave its inputs as they were (A and B are compared with pristine copies) and write nothing
  around them: A and B too lie between guard bands of the sentinel, so a read past either
  operand's end that reaches the math also turns its output NaN;
- give the same bits on a second launch on the same buffers (every family here reduces in a
  fixed order, so any difference is a race or state left behind, e.g. a split-K counter);
- for kernels whose grid depends on the GPU (persistent schedulers), also be right on a small
  grid, where each CTA takes several work units.
The first launch of a trial is a throw-away run on a workspace zeroed once per trial, and every
later launch runs on what the one before left there: a kernel that leaves a split-K counter or
its workspace dirty fails the launches after it. That is the runtime's use too (a plan zeroes
its workspace once), so state a kernel leaves behind is judged by whether the next launch is
right and bit-identical, not by reading the workspace (whose layout is the family's own).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from tunefw.evaluate.method import Verdict, verify

GUARD_ELEMS = 4096  # 8 KB of 16-bit elements each side of C, A and B (keeps them 256-byte aligned)
SENTINEL = 0x7FA5  # a NaN in bf16 and in fp16 that no arithmetic produces (payload 0x25)


class Banded:
    """A tensor (``inner``) inside guard bands of SENTINEL, GUARD_ELEMS elements on each side."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
                 name: str) -> None:
        self.name = name
        size = math.prod(shape)
        self.full = torch.empty(size + 2 * GUARD_ELEMS, dtype=dtype, device=device)
        self.inner = self.full[GUARD_ELEMS:GUARD_ELEMS + size].view(shape)
        self.restore_bands()

    @classmethod
    def holding(cls, values: torch.Tensor, name: str) -> "Banded":
        """A banded copy of ``values``."""
        banded = cls(tuple(values.shape), values.dtype, values.device, name)
        banded.inner.copy_(values)
        return banded

    def restore_bands(self) -> None:
        bits = self.full.view(torch.int16)
        bits[:GUARD_ELEMS].fill_(SENTINEL)
        bits[-GUARD_ELEMS:].fill_(SENTINEL)

    def bands_intact(self) -> str | None:
        """None, or where the first write around ``inner`` landed (the bands are then restored,
        so later trials on the same buffers are unharmed)."""
        bits, name = self.full.view(torch.int16), self.name
        for side, band, base in (("before", bits[:GUARD_ELEMS], -GUARD_ELEMS),
                                 ("after", bits[-GUARD_ELEMS:], self.inner.numel())):
            hit = (band != SENTINEL).nonzero()
            if hit.numel():
                self.restore_bands()
                return (f"wrote outside {name}: {hit.numel()} element(s) of the guard band {side} "
                        f"{name}, first at offset {base + int(hit[0])} from {name}'s start")
        return None


class GuardedOutput(Banded):
    """An M x N output inside guard bands of SENTINEL."""

    def __init__(self, like: torch.Tensor) -> None:
        super().__init__(tuple(like.shape), like.dtype, like.device, "C")

    @property
    def c(self) -> torch.Tensor:
        return self.inner

    def poison(self) -> None:
        """Every element, C and guards, set to the sentinel (an unwritten C element stays NaN)."""
        self.full.view(torch.int16).fill_(SENTINEL)

    def guards_intact(self) -> str | None:
        """None, or where the first write outside C landed."""
        return self.bands_intact()


def differing_bits(out: torch.Tensor, first: torch.Tensor) -> str | None:
    """None if ``out`` has the same bits as ``first``, else how many elements differ and where."""
    diff = out.view(torch.int16) != first.view(torch.int16)
    if not bool(diff.any()):
        return None
    r, c = (int(x) for x in diff.nonzero()[0])
    return (f"second launch differs from the first: {int(diff.sum())} element(s), first at "
            f"({r}, {c}) (a race, or state a launch leaves behind)")


@dataclass
class Operands:
    """A, B, their pristine copies, the float32 reference and cuBLAS's output on them. A and B
    are moved, on construction, into guard bands (``a`` and ``b`` are then views inside them)."""

    a: torch.Tensor
    b: torch.Tensor
    a0: torch.Tensor
    b0: torch.Tensor
    ref: torch.Tensor
    cublas_out: torch.Tensor
    bands: tuple[Banded, Banded] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.bands = (Banded.holding(self.a, "A"), Banded.holding(self.b, "B"))
        self.a, self.b = (band.inner for band in self.bands)

    def changed(self) -> str | None:
        """None, or which input the kernel wrote into or around (restored, so later trials are
        unharmed)."""
        for band in self.bands:
            reason = band.bands_intact()
            if reason:
                return reason
        for name, now, before in (("A", self.a, self.a0), ("B", self.b, self.b0)):
            if not torch.equal(now.view(torch.int16), before.view(torch.int16)):
                now.copy_(before)
                return f"wrote into its input {name}"
        return None


def strict_verify(run: Callable[[], None], wait: Callable[[], None], out: GuardedOutput,
                  operands: Operands, dtype: str,
                  small_grid: Callable[[], None] | None = None) -> Verdict:
    """Run the kernel (a throw-away launch, then verified ones) and judge it as the module says."""
    run()
    wait()
    reason = operands.changed()
    if reason:
        return Verdict(False, float("inf"), reason)
    verdict = Verdict(True, 0.0)
    first = None
    for launch, what in ((run, "launch"), (run, "second launch"), (small_grid, "small grid")):
        if launch is None:
            continue
        out.poison()
        launch()
        wait()
        reason = out.guards_intact() or operands.changed()
        if reason:
            return Verdict(False, float("inf"), f"{what}: {reason}")
        if first is not None and launch is run:
            reason = differing_bits(out.c, first)
            if reason:
                return Verdict(False, verdict.rel_err, reason)
            continue
        checked = verify(out.c, operands.ref, dtype, baseline=operands.cublas_out)
        if not checked.ok:
            return Verdict(False, checked.rel_err,
                           checked.reason if what == "launch" else f"{what}: {checked.reason}")
        if first is None:
            verdict, first = checked, out.c.clone()
    return verdict
