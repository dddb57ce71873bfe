"""The correctness method shared by every evaluator (design.md: 'Timing and correctness').

A result passes only if it has no NaN/Inf (the output is NaN-poisoned before the run, so an
unwritten element fails here), and its relative Frobenius error against a float32 reference is
under the dtype bound and under 4x the error of cuBLAS on the same inputs, globally and per row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPE_BOUND = {"bf16": 2e-2, "fp16": 2e-2}
UNIT_ROUNDOFF = {"bf16": 2.0**-9, "fp16": 2.0**-12}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
CUBLAS_FACTOR = 4.0


@dataclass
class Verdict:
    ok: bool
    rel_err: float
    reason: str = ""


def make_inputs(M: int, N: int, K: int, dtype: str, seed: int, device: str = "cpu"):
    """Random normal operands (never zeros: they hide unwritten outputs and wrong indexing)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(M, K, generator=gen, device=device, dtype=torch.float32).to(TORCH_DTYPE[dtype])
    b = torch.randn(N, K, generator=gen, device=device, dtype=torch.float32).to(TORCH_DTYPE[dtype])
    return a, b


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float32 reference C = A B^T."""
    return a.float() @ b.float().T


def row_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    diff = (out.float() - ref).norm(dim=1)
    return diff / ref.norm(dim=1).clamp_min(1e-30)


def frobenius_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def verify(out: torch.Tensor, ref: torch.Tensor, dtype: str,
           baseline: torch.Tensor | None = None) -> Verdict:
    """Judge a kernel's output against the float32 reference and (if given) cuBLAS's output."""
    if out.shape != ref.shape:
        return Verdict(False, float("inf"), f"output shape {tuple(out.shape)} != {tuple(ref.shape)}")
    finite = torch.isfinite(out)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        r, c = (int(x) for x in bad[0])
        return Verdict(False, float("inf"),
                       f"{bad.shape[0]} non-finite elements (unwritten or NaN), first at ({r}, {c})")
    bound = DTYPE_BOUND[dtype]
    floor = UNIT_ROUNDOFF[dtype]
    err = frobenius_error(out, ref)
    base_err = frobenius_error(baseline, ref) if baseline is not None else 0.0
    limit = min(bound, CUBLAS_FACTOR * max(base_err, floor)) if baseline is not None else bound
    if err > limit:
        return Verdict(False, err, f"relative error {err:.3e} > limit {limit:.3e} "
                                   f"(dtype bound {bound:g}, cuBLAS {base_err:.3e})")
    rows = row_errors(out, ref)
    row_limit = torch.full_like(rows, bound)
    if baseline is not None:
        row_limit = torch.minimum(row_limit, CUBLAS_FACTOR * row_errors(baseline, ref).clamp_min(floor))
    over = rows > row_limit
    if bool(over.any()):
        r = int(over.nonzero()[0])
        return Verdict(False, err, f"{int(over.sum())} rows over their limit, first row {r}: "
                                   f"{float(rows[r]):.3e} > {float(row_limit[r]):.3e}")
    return Verdict(True, err)
