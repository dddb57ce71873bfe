"""GEMM problems: the shape, dtype and layout a kernel is tuned for, validated on entry."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tunefw.errors import UserError

DTYPES = ("bf16", "fp16")
LAYOUTS = ("TN",)
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
DIM_MAX = 2**31 - 1  # M, N, K: what a kernel's int32 indexing and an SQL INTEGER column hold


@dataclass(frozen=True, order=True)
class GemmProblem:
    """C[M,N] = A[M,K] @ B[N,K]^T (TN: both operands K-contiguous, like ``F.linear``)."""

    M: int
    N: int
    K: int
    dtype: str = "bf16"
    layout: str = "TN"

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

    def key(self) -> str:
        """Stable text key, used for database rows and dispatch entries."""
        return f"{self.M}x{self.N}x{self.K}:{self.dtype}:{self.layout}"

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def min_bytes(self) -> int:
        """Fewest bytes of device memory traffic: each operand read once, C written once."""
        e = DTYPE_BYTES[self.dtype]
        return e * (self.M * self.K + self.N * self.K + self.M * self.N)

    def log_distance(self, other: "GemmProblem") -> float:
        """Euclidean distance over (log M, log N, log K); the dispatch 'nearest' metric."""
        return math.sqrt(
            sum((math.log(a) - math.log(b)) ** 2 for a, b in
                ((self.M, other.M), (self.N, other.N), (self.K, other.K)))
        )

    def as_dict(self) -> dict:
        return {"M": self.M, "N": self.N, "K": self.K, "dtype": self.dtype, "layout": self.layout}


_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shape(text: str, dtype: str = "bf16") -> GemmProblem:
    """Parse 'MxNxK' (as typed on the command line) into a validated problem."""
    match = _SHAPE.match(text) if len(text) <= 64 else None
    if not match:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise UserError(f"shape {shown!r}: expected MxNxK, e.g. 4096x4096x4096")
    m, n, k = (int(g) for g in match.groups())
    return GemmProblem(m, n, k, dtype)
