"""benchmarks/launch_roofline.py: a launch's fixed cost and bandwidth fitted per read variant, the
stream micro's errata honoured, decode rows read against the lowest line."""
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "launch_roofline.py"
spec = importlib.util.spec_from_file_location("launch_roofline", SCRIPT)
roof = importlib.util.module_from_spec(spec)
spec.loader.exec_module(roof)

MB32, MB224 = 4096 * 4096 * 2, 28672 * 4096 * 2


def _line_us(nbytes: int, t0: float, tbs: float) -> float:
    return t0 + nbytes / (tbs * 1e6)


def _micro(errata: bool) -> dict:
    rows = [{"variant": "null", "us": 3.9}]
    for n in (4096, 28672):
        size = n * 4096 * 2
        rows.append({"variant": "ldg", "N": n, "K": 4096, "us": _line_us(size, 3.0, 4.0)})
        rows.append({"variant": "ldg", "N": n, "K": 4096, "us": 2 * _line_us(size, 3.0, 4.0)})
        rows.append({"variant": "bulk", "N": n, "K": 4096, "us": _line_us(size, 3.5, 4.5)})
    doc = {"rows": rows}
    if errata:
        doc["errata"] = {"bulk_best_recomputed": {
            f"{n}x4096": {"weight_bytes": n * 4096 * 2, "bytes_read": n * 4096,
                          "us": _line_us(n * 4096, 4.0, 5.0)} for n in (4096, 28672)}}
    return doc


def test_fit_line_recovers_a_line_and_refuses_one_point():
    t0, slope = roof.fit_line([(1.0, 5.0), (3.0, 9.0), (5.0, 13.0)])
    assert (t0, slope) == pytest.approx((3.0, 2.0))
    with pytest.raises(ValueError, match="two distinct"):
        roof.fit_line([(2.0, 1.0), (2.0, 3.0)])


def test_floor_takes_each_variants_fastest_rows_and_the_errata_bulk_bytes():
    lines = roof.launch_floor(_micro(errata=True))["lines"]
    assert set(lines) == {"ldg", "bulk"}
    assert lines["ldg"]["t0_us"] == pytest.approx(3.0)
    assert lines["ldg"]["bw_tbs"] == pytest.approx(4.0)
    assert lines["bulk"]["t0_us"] == pytest.approx(4.0)  # the recomputed bytes, not the rows
    assert lines["bulk"]["bw_tbs"] == pytest.approx(5.0)
    assert lines["ldg"]["max_rel_residual"] == pytest.approx(0.0, abs=1e-9)


def test_without_errata_the_bulk_rows_are_trusted():
    lines = roof.launch_floor(_micro(errata=False))["lines"]
    assert (lines["bulk"]["t0_us"], lines["bulk"]["bw_tbs"]) == pytest.approx((3.5, 4.5))


def test_a_line_that_does_not_rise_is_no_read():
    doc = {"rows": [{"variant": "tma", "N": n, "K": 4096, "us": 1.0} for n in (4096, 28672)]}
    with pytest.raises(ValueError, match="no read variant"):
        roof.launch_floor(doc)


def test_ceiling_is_the_lowest_line_at_the_asked_bytes():
    floor = roof.launch_floor(_micro(errata=True))
    # ldg (3 us + 4 TB/s) wins small, bulk (4 us + 5 TB/s) large: crossover at 20 MB
    assert roof.ceiling_us(8e6, floor) == pytest.approx(_line_us(8e6, 3.0, 4.0))
    assert roof.ceiling_us(MB32, floor) == pytest.approx(_line_us(MB32, 4.0, 5.0))
    assert roof.ceiling_us(MB224, floor) == pytest.approx(_line_us(MB224, 4.0, 5.0))


def test_rows_are_read_against_memory_or_tensor_bound_and_newest_wins(tmp_path):
    floor = roof.launch_floor(_micro(errata=True))
    nbytes = MB32 + 2 * 4096 * 2 * 2
    old = {"rows": [{"family": "a", "M": 1, "N": 4096, "K": 4096, "bytes": nbytes,
                     "tbs": 3.0, "cublas_tbs": 1.0}]}
    new = {"rows": [
        {"family": "b", "M": 1, "N": 4096, "K": 4096, "bytes": nbytes, "tbs": 2.0,
         "cublas_tbs": 2.5},
        {"family": "c", "M": 1, "N": 4096, "K": 4096, "bytes": nbytes, "tbs": 2.2,
         "cublas_tbs": 2.5},
        {"family": "d", "M": 8192, "N": 8192, "K": 8192, "bytes": 3 * 8192 * 8192 * 2,
         "tbs": 0.1, "cublas_tbs": 0.1},
        {"family": "e", "M": 3, "N": 3, "K": 3}]}  # no bytes: skipped
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    rows = roof.read_rows(tmp_path / "old.json", floor) + roof.read_rows(tmp_path / "new.json",
                                                                         floor)
    assert [r["family"] for r in rows] == ["a", "b", "c", "d"]
    b = rows[1]
    assert b["us"] == pytest.approx(nbytes / 2.0e6)
    assert b["ratio"] == pytest.approx(2.0 / 2.5)
    assert b["of_ceiling"] == pytest.approx(roof.ceiling_us(nbytes, floor) / b["us"])
    assert (b["bound"], rows[3]["bound"]) == ("memory", "tensor")
    newest = roof.newest_by_shape(rows)
    # the old run's 3x (its cuBLAS was slow) does not outrank the newest run's best
    assert [r["family"] for r in newest] == ["c", "d"]


def test_graph_times_are_fitted_when_every_read_row_has_them():
    doc = _micro(errata=False)
    assert roof.launch_floor(doc)["timing"] == "us"
    for row in doc["rows"]:
        if row["variant"] != "null":
            row["graph_us"] = row["us"] - 1.0  # a graph's gap is a microsecond shorter
    floor = roof.launch_floor(doc)
    assert floor["timing"] == "graph_us"
    assert floor["lines"]["ldg"]["t0_us"] == pytest.approx(2.0)


def test_issue_13s_bars_are_read_against_the_ceiling():
    assert [roof.target(m) for m in (1, 16, 17, 32, 128, 129, 1000, 4097, 2048)] == [
        1.05, 1.05, None, 1.10, 1.10, 1.00, 1.00, 1.00, None]
    far = roof.against_target({"M": 8, "ceiling_over_cublas": 1.26})
    assert far["reachable"] and far["needed_of_ceiling"] == pytest.approx(1.05 / 1.26)
    near = roof.against_target({"M": 64, "ceiling_over_cublas": 1.088})
    assert near["reachable"] is False and near["needed_of_ceiling"] > 1  # no launch can
    assert roof.against_target({"M": 2048, "ceiling_over_cublas": 3.0})["target"] is None
