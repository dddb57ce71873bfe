"""A Triton TN matmul (C = A @ B^T, A: MxK, B: NxK), autotuned over a standard config list.

The reference `tunefw bench` compares against: the usual tiled Triton GEMM (grouped launch
order, fp32 accumulation), autotuned per (M, N, K) by Triton's own autotuner over CONFIGS,
the tile/stage/warp combinations of the Triton matmul tutorial plus Hopper-sized tiles.
Importing this module needs triton.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _config(bm: int, bn: int, bk: int, group: int, stages: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                         num_stages=stages, num_warps=warps)


CONFIGS = [
    _config(128, 256, 64, 8, 3, 8),
    _config(256, 128, 64, 8, 3, 8),
    _config(128, 256, 64, 8, 4, 8),
    _config(256, 128, 32, 8, 4, 8),
    _config(128, 128, 64, 8, 4, 8),
    _config(128, 128, 64, 8, 3, 4),
    _config(128, 64, 64, 8, 4, 4),
    _config(64, 128, 64, 8, 4, 4),
    _config(128, 32, 32, 8, 4, 4),
    _config(64, 32, 32, 8, 5, 2),
    _config(32, 64, 64, 8, 5, 2),
    _config(64, 64, 128, 8, 3, 4),
]


# C = A B^T for K-contiguous A and B, grouped tile order (tests launch it on one config).
@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_tn_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_size = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_size
    pid_n = (pid % in_group) // group_size
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + rm[:, None] * stride_am + rk[None, :]
    b_tile = b_ptr + rn[None, :] * stride_bn + rk[:, None]  # B^T tile: [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_tile, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_tile, mask=(rn[None, :] < N) & (rk[:, None] < k_left), other=0.0)
        acc = tl.dot(a, b, acc)
        a_tile += BLOCK_K
        b_tile += BLOCK_K
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = a @ b.T for contiguous a (MxK) and b (NxK); the first call per shape autotunes."""
    assert a.is_contiguous() and b.is_contiguous() and a.shape[1] == b.shape[1]
    M, K = a.shape
    N = b.shape[0]
    c = out if out is not None else a.new_empty((M, N))
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    matmul_tn_kernel[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    return c
