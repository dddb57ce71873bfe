"""benchmarks/decode_ceiling.py: a decode step's GEMMs under cuBLAS, served, at the HBM roofline
and at the launch ceiling, and the end-to-end speedups each allows."""
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
spec = importlib.util.spec_from_file_location("decode_ceiling", BENCH / "decode_ceiling.py")
ceiling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ceiling)

FLOOR = {"lines": {"ldg": {"t0_us": 3.0, "bw_tbs": 4.0}}}


def _rows(m: int) -> list[dict]:
    shapes = [*ceiling.PER_LAYER, ceiling.LM_HEAD]
    return [{"M": m, "N": n, "K": k, "tflops": 2.0, "cublas_tflops": 1.0} for n, k in shapes]


def test_each_gemm_is_timed_four_ways():
    per = ceiling.gemm_us(_rows(1) + [{"M": 16, "N": 1, "K": 1}], 1, 4.0, FLOOR)
    assert set(per) == {*ceiling.PER_LAYER, ceiling.LM_HEAD}  # the M = 16 row is not M = 1's
    n, k = 4096, 4096
    nbytes = 2.0 * (n * k + k + n)
    g = per[(n, k)]
    assert g["cublas_us"] == pytest.approx(2.0 * n * k / 1.0 / 1e6)
    assert g["served_us"] == pytest.approx(g["cublas_us"] / 2)  # the winner is twice cuBLAS
    assert g["roofline_us"] == pytest.approx(nbytes / 4e12 * 1e6)
    assert g["launch_us"] == pytest.approx(3.0 + nbytes / 4e6)  # a launch's fixed cost on top


def test_the_rest_of_the_step_is_held_and_only_gemms_change():
    per = {s: {"cublas_us": 10.0, "served_us": 8.0, "roofline_us": 4.0, "launch_us": 6.0}
           for s in (*ceiling.PER_LAYER, ceiling.LM_HEAD)}
    calls = sum(ceiling.PER_LAYER.values())  # 7 a layer
    stock_ms = (2 * calls * 10.0 + 10.0 + 2 * 100.0) / 1e3  # 2 layers, lm_head, 100 us rest each
    out = ceiling.step_ceilings(per, stock_ms, layers=2, at_layers=2)
    assert out["rest_per_layer_us"] == pytest.approx(100.0)
    stock = stock_ms * 1e3
    for kind, us in (("served", 8.0), ("roofline", 4.0), ("launch", 6.0)):
        gemms = (2 * calls + 1) * us
        assert out[f"{kind}_speedup"] == pytest.approx(stock / (200.0 + gemms))
    assert out["gemm_launch_us"] == pytest.approx((2 * calls + 1) * 6.0)
