"""GEMM problems: the shape, dtype and layout a kernel is tuned for, validated on entry."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tunefw.errors import UserError

DTYPES = ("bf16", "fp16")
LAYOUTS = ("TN",)
# A gated problem (Llama's SwiGLU MLP in one GEMM): B is [Bg; Bu], 2N rows, and
# C = silu(A Bg^T) * (A Bu^T), combined in fp32 before the one rounding. "none": C = A B^T.
GATES = ("none", "silu")
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
DIM_MAX = 2**31 - 1  # M, N, K: what a kernel's int32 indexing and an SQL INTEGER column hold


@dataclass(frozen=True, order=True)
class GemmProblem:
    """C[M,N] = A[M,K] @ B[N,K]^T (TN: both operands K-contiguous, like ``F.linear``); with
    ``gate="silu"``, C = silu(A @ Bg^T) * (A @ Bu^T) over a weight B = [Bg; Bu] of 2N rows."""

    M: int
    N: int
    K: int
    dtype: str = "bf16"
    layout: str = "TN"
    gate: str = "none"

    def __post_init__(self) -> None:
        for field, value in (("M", self.M), ("N", self.N), ("K", self.K)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"problem {field}={value!r}: expected an integer")
            if value > DIM_MAX:
                raise UserError(f"problem {field}={value}: expected at most 2^31-1 ({DIM_MAX})")
        if self.M < 1:
            raise UserError(f"problem M={self.M}: M must be >= 1")
        for field, value in (("N", self.N), ("K", self.K)):
            if value < 8 or value % 8:
                raise UserError(
                    f"problem {field}={value}: {field} must be a positive multiple of 8 "
                    "(rows of 16 bytes)"
                )
        if self.dtype not in DTYPES:
            raise UserError(f"problem dtype={self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise UserError(f"problem layout={self.layout!r}: expected one of {', '.join(LAYOUTS)}")
        if self.gate not in GATES:
            raise UserError(f"problem gate={self.gate!r}: expected one of {', '.join(GATES)}")

    def key(self) -> str:
        """Stable text key, used for database rows and dispatch entries."""
        gate = "" if self.gate == "none" else f":{self.gate}"
        return f"{self.M}x{self.N}x{self.K}:{self.dtype}:{self.layout}{gate}"

    @property
    def weight_rows(self) -> int:
        """Rows of B: N, or 2N for a gated problem ([Bg; Bu])."""
        return self.N if self.gate == "none" else 2 * self.N

    def tile_out_cols(self, tile_rows: int) -> int:
        """Columns of C a tile of ``tile_rows`` weight rows writes: all, or half when gated
        (its rows are that many of Bg over the same of Bu)."""
        return tile_rows if self.gate == "none" else tile_rows // 2

    @property
    def flops(self) -> int:
        return 2 * self.M * self.weight_rows * self.K

    @property
    def min_bytes(self) -> int:
        """Fewest bytes of device memory traffic: each operand read once, C written once."""
        e = DTYPE_BYTES[self.dtype]
        return e * (self.M * self.K + self.weight_rows * self.K + self.M * self.N)

    def log_distance(self, other: "GemmProblem") -> float:
        """Euclidean distance over (log M, log N, log K); the dispatch 'nearest' metric."""
        return math.sqrt(
            sum((math.log(a) - math.log(b)) ** 2 for a, b in
                ((self.M, other.M), (self.N, other.N), (self.K, other.K)))
        )

    def as_dict(self) -> dict:
        """The fields, ``gate`` only when gated (so a plain problem's records read as before)."""
        d = {"M": self.M, "N": self.N, "K": self.K, "dtype": self.dtype, "layout": self.layout}
        return d if self.gate == "none" else {**d, "gate": self.gate}


_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*([A-Za-z]+)\s*)?$")


def parse_shape(text: str, dtype: str = "bf16") -> GemmProblem:
    """Parse 'MxNxK' or a gated 'MxNxK:silu' (as typed on the command line) into a validated
    problem."""
    match = _SHAPE.match(text) if len(text) <= 64 else None
    if not match:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise UserError(f"shape {shown!r}: expected MxNxK or MxNxK:GATE, e.g. 4096x4096x4096 "
                        "or 16x14336x4096:silu")
    m, n, k = (int(g) for g in match.groups()[:3])
    return GemmProblem(m, n, k, dtype, gate=match.group(4) or "none")


def problem_text(p: dict) -> str:
    """A problem's row (M, N, K, dtype[, gate]) as tables and pages show it: ``16x14336x4096
    bf16``, ``... bf16 silu`` when gated."""
    gate = p.get("gate", "none")
    return f"{p['M']}x{p['N']}x{p['K']} {p['dtype']}" + ("" if gate == "none" else f" {gate}")
