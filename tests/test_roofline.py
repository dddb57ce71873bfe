"""Rooflines: bytes, bound and the measured figures every decode result carries."""
from __future__ import annotations

import pytest

from tunefw.device import H200, spec_for
from tunefw.measure.bench import add_roofline
from tunefw.problem import GemmProblem
from tunefw.measure.roofline import figures, roofline


def test_decode_is_memory_bound_and_large_squares_compute_bound():
    decode = roofline(GemmProblem(16, 4096, 4096), H200)
    assert decode.bytes == 2 * (16 * 4096 + 4096 * 4096 + 16 * 4096)
    assert decode.bound == "memory"
    assert decode.memory_us == pytest.approx(decode.bytes / 4226e3)  # the measured read, not 4.8 TB/s
    assert roofline(GemmProblem(4096, 4096, 4096), H200).bound == "compute"
    # where the two ceilings cross on the H200: about 234 FLOPs per byte
    assert roofline(GemmProblem(128, 6144, 4096), H200).bound == "memory"
    assert roofline(GemmProblem(512, 6144, 4096), H200).bound == "compute"


def test_figures_turn_tflops_into_bandwidth():
    p = GemmProblem(1, 4096, 4096)
    seconds = 10e-6
    got = figures(p, p.flops / seconds / 1e12, read_tbs=4.0)
    assert got["tbs"] == pytest.approx(p.min_bytes / seconds / 1e12)
    assert got["frac_of_read"] == pytest.approx(got["tbs"] / 4.0)
    assert figures(p, None, 4.0) == {"bytes": p.min_bytes, "tbs": None, "frac_of_read": None}


def test_bench_rows_carry_both_sides_and_the_bound():
    row = {"M": 16, "N": 4096, "K": 14336, "dtype": "bf16", "tflops": 47.0, "cublas_tflops": 44.0}
    add_roofline(row, 4.2, H200)
    assert row["bound"] == "memory" and row["cublas_tbs"] < row["tbs"]
    assert row["frac_of_read"] == pytest.approx(row["tbs"] / 4.2)


def test_a_live_gpu_keeps_the_known_measured_bandwidth():
    live = spec_for(H200.name, 90, 132, 232448, 233472, 60 * 2**20)
    assert live.stream_read_gbs == H200.stream_read_gbs
    assert spec_for("Some GPU", 90, 100, 1, 1, 1).stream_read_gbs == 0.0
