"""benchmarks/launch_gap_h200.py: a shape's row from its two interleaved graph timings."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "launch_gap_h200.py"
spec = importlib.util.spec_from_file_location("launch_gap_h200", SCRIPT)
gap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gap)


def _timed(stock_ms: float, patched_ms: float) -> dict:
    return {"stock": {"median_ms": stock_ms}, "patched": {"median_ms": patched_ms},
            "speedup": {"median": stock_ms / patched_ms}}


def test_the_row_is_per_gemm_with_the_deficit_and_what_programmatic_launches_win():
    # 8 GEMMs a chain: cuBLAS 0.112 ms (14 us a GEMM), plain 0.128 (16 us), programmatic 0.120
    row = gap.gap_row("64x4096x4096", 8, _timed(0.112, 0.128), _timed(0.112, 0.120))
    assert row["cublas_us"] == pytest.approx(14.0)
    assert (row["plain_us"], row["programmatic_us"]) == (pytest.approx(16.0), pytest.approx(15.0))
    assert row["deficit_us"] == pytest.approx(2.0)
    assert row["programmatic_gain_us"] == pytest.approx(1.0)
    assert row["ratio_plain"] == pytest.approx(0.875) and row["ratio_programmatic"] == pytest.approx(0.9333, abs=1e-4)


def test_default_shapes_are_exact_entries_of_the_default_table():
    import json
    entries = {f"{e['M']}x{e['N']}x{e['K']}" for e in json.loads(gap.TABLE.read_text())["entries"]}
    assert set(gap.SHAPES.split(",")) <= entries
