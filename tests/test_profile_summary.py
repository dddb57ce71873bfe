"""benchmarks/profile_h200.py --summarize: ncu's raw CSV -> a row per shape, tunefw beside cuBLAS."""
import argparse
import csv
import importlib.util
import io
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "profile_h200.py"
spec = importlib.util.spec_from_file_location("profile_h200", SCRIPT)
profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile)

COLUMNS = ["ID", "Kernel Name", "launch__grid_size", "launch__cluster_dim_x",
           *(metric for metric, _ in profile.METRICS.values())]


def _row(i: int, name: str, time_ns: float, grid: int = 132, cluster: int = 2) -> list[str]:
    values = {"gpu__time_duration.sum": f"{time_ns:,.0f}", "dram__bytes_read.sum": "1,000,000",
              "lts__t_bytes.sum": "2,000,000", "gpc__cycles_elapsed.avg.per_second": "1,500,000,000",
              "sm__throughput.avg.pct_of_peak_sustained_elapsed": "90",
              "lts__throughput.avg.pct_of_peak_sustained_elapsed": "50",
              "dram__throughput.avg.pct_of_peak_sustained_elapsed": "70"}
    return [str(i), name, str(grid), str(cluster), *(values[m] for m, _ in profile.METRICS.values())]


def _csv(tmp_path: Path, rows: list[list[str]]) -> Path:
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(COLUMNS)
    writer.writerow(["", "", "", "", "nsecond", "byte", "byte", "hz", "%", "%", "%"])  # ncu's units row
    writer.writerows(rows)
    path = tmp_path / "ncu.csv"
    path.write_text("==PROF== Connected to process 1\n" + out.getvalue())
    return path


# A committed table: its entries run in file order (1x4096x4096 first, 16x4096x14336 later).
TABLE = SCRIPT.parent / "results" / "dispatch_decode3_h200.json"


def _args(shapes: str) -> argparse.Namespace:
    return argparse.Namespace(shapes=shapes, table=TABLE, device="H200", script_commit="abc",
                              note="")


def test_shapes_pair_tunefw_with_cublas_and_sum_its_reduce_kernel(tmp_path):
    ours, gemm, reduce, norm = ("void gemm_wgmma_sm90<0, 64>", "nvjet_sm90_tst_128x16_splitK",
                                "void cublasLt::splitKreduce_kernel", "void at::reduce_kernel")
    rows = [_row(1, ours, 20_000), _row(2, ours, 22_000),            # shape 1: tunefw x2
            _row(3, gemm, 18_000), _row(4, gemm, 18_000), _row(5, norm, 9_000),
            _row(6, ours, 34_000), _row(7, ours, 34_000),            # shape 2
            _row(8, gemm, 31_000), _row(9, reduce, 3_000, 128, 0),
            _row(10, gemm, 31_000), _row(11, reduce, 3_000, 128, 0)]
    # named out of order: the launches ran (and the rows are labelled) in the table's order
    result = profile.summarize(_csv(tmp_path, rows), _args("16x4096x14336,1x4096x4096"))
    first, second = result["rows"]
    assert (first["shape"], second["shape"]) == ("1x4096x4096", "16x4096x14336")
    assert first["tunefw"]["time_us"] == pytest.approx(21.0)  # median of the two launches
    assert first["cublas"]["kernels"] == [gemm] and first["cublas"]["launches"] == 2
    assert first["ratio"] == pytest.approx(18.0 / 21.0)
    assert second["cublas"]["kernels"] == [gemm, reduce]  # one cuBLAS call = two kernels
    assert second["cublas"]["time_us"] == pytest.approx(34.0)
    assert second["cublas"]["grid"] == [132, 128] and second["cublas"]["cluster"] == [2, 1]
    assert second["cublas"]["dram_read_mb"] == pytest.approx(2.0)  # bytes add up over a call
    assert second["cublas"]["sm_clock_mhz"] == pytest.approx(1500.0)  # rates do not
    assert result["script_commit"] == "abc"


def test_first_use_checks_profiled_too_leave_only_the_timed_launches(tmp_path):
    """A CSV profiled from the start also holds each kernel's first-use proof: cuBLAS and an
    fp32 reference before our first launch, our single checked launches, torch's and CUB's
    kernels between them. Only a run of ours followed by cuBLAS's is a compared launch."""
    ours, gemm, ref = "void gemm_wgmma_sm90<0, 64>", "nvjet_sm90_tst_64x32", "sm80_xmma_gemm_f32f32"
    cub, norm = "void select::DeviceSelectSweepKernel", "void at::reduce_kernel"
    rows = [_row(1, gemm, 9_000), _row(2, ref, 50_000), _row(3, ours, 99_000), _row(4, cub, 1_000),
            _row(5, ours, 98_000), _row(6, norm, 1_000),
            _row(7, ours, 20_000), _row(8, ours, 22_000), _row(9, gemm, 18_000),
            _row(10, gemm, 18_000), _row(11, norm, 1_000),                # shape 1, timed
            _row(12, gemm, 30_000), _row(13, ref, 60_000), _row(14, ours, 97_000),
            _row(15, cub, 1_000), _row(16, ours, 34_000), _row(17, ours, 34_000),
            _row(18, gemm, 31_000), _row(19, gemm, 31_000)]              # shape 2, timed
    first, second = profile.summarize(_csv(tmp_path, rows), _args("1x4096x4096,16x4096x14336"))["rows"]
    assert first["tunefw"]["time_us"] == pytest.approx(21.0) and first["cublas"]["launches"] == 2
    assert first["cublas"]["kernels"] == [gemm] and first["cublas"]["time_us"] == pytest.approx(18.0)
    assert second["tunefw"]["time_us"] == pytest.approx(34.0)
    assert second["cublas"]["time_us"] == pytest.approx(31.0)


def test_sm_busy_is_the_share_of_elapsed_cycles_an_sm_had_work(tmp_path):
    columns = COLUMNS + list(profile.BUSY)

    def row(i, name, active, elapsed):
        return _row(i, name, 20_000) + [active, elapsed]

    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(columns)
    writer.writerows([row(1, "void gemm_wgmma_sm90<0>", "7,500", "10,000"),
                      row(2, "nvjet_x", "9,000", "10,000")])
    path = tmp_path / "ncu.csv"
    path.write_text(out.getvalue())
    first, = profile.summarize(path, _args("1x4096x4096"))["rows"]
    assert first["tunefw"]["sm_busy_pct"] == pytest.approx(75.0)
    assert first["cublas"]["sm_busy_pct"] == pytest.approx(90.0)


def test_a_shape_list_that_does_not_match_the_csv_is_refused(tmp_path):
    rows = [_row(1, "void gemm_wgmma_sm90<0>", 20_000), _row(2, "nvjet_x", 18_000)]
    with pytest.raises(SystemExit, match="names 2 shapes, the CSV holds 1"):
        profile.summarize(_csv(tmp_path, rows), _args("1x2x3,4x5x6"))


def test_stall_reasons_are_kept_per_side_largest_first(tmp_path):
    stall = profile.STALL_PREFIX + "{}" + profile.STALL_SUFFIX
    extra = [stall.format("long_scoreboard"), stall.format("barrier"), stall.format("wait")]
    columns = COLUMNS + extra

    def row(i, name, values):
        return _row(i, name, 20_000) + values

    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(columns)
    writer.writerows([row(1, "void gemm_wgmma_sm90<0>", ["1.5", "4.25", "0.5"]),
                      row(2, "nvjet_x", ["3.0", "0.1", "0.2"])])
    path = tmp_path / "ncu.csv"
    path.write_text(out.getvalue())
    first, = profile.summarize(path, _args("1x4096x4096"))["rows"]
    assert list(first["tunefw"]["stalls_per_issue"].items()) == [
        ("barrier", 4.25), ("long_scoreboard", 1.5), ("wait", 0.5)]
    assert first["cublas"]["stalls_per_issue"]["long_scoreboard"] == 3.0


def test_any_route_serves_cublas_routes_by_their_tuned_config(tmp_path):
    table = SCRIPT.parent / "results" / "dispatch_llama3_8b_h200.json"
    copy = profile.kernel_routes(table)
    import json
    before = json.loads(table.read_text())["entries"]
    after = json.loads(copy.read_text())["entries"]
    assert len(before) == len(after)
    routed = [i for i, e in enumerate(before) if e.get("route") == "cublas" and e.get("config")]
    assert routed and all("route" not in after[i] and "reason" not in after[i] for i in routed)
    assert all(after[i]["config"] == before[i]["config"] for i in routed)
    kept = [i for i, e in enumerate(before) if i not in routed]
    assert all(after[i] == before[i] for i in kept)
