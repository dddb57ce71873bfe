"""The Triton reference matmul computes A @ B^T (checked in Triton's CPU interpreter)."""
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("triton")

SCRIPT = """
import torch, triton
from tunefw.measure.triton_ref import CONFIGS, matmul_tn_kernel
for M, N, K in [(64, 64, 64), (33, 40, 72), (130, 24, 200)]:
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(N, K, dtype=torch.float16)
    c = torch.empty(M, N, dtype=torch.float16)
    grid = (triton.cdiv(M, 32) * triton.cdiv(N, 32),)
    matmul_tn_kernel.fn[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0),
                        BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2)
    err = ((c.float() - a.float() @ b.float().T).norm() / (a.float() @ b.float().T).norm()).item()
    assert err < 1e-3, (M, N, K, err)
print(len(CONFIGS))
"""


def test_triton_tn_matmul_in_the_interpreter():
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO,
                         env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert int(ran.stdout.split()[-1]) >= 10
