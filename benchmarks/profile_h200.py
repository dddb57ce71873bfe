"""Hardware counters of each dispatch-table kernel beside the cuBLAS kernel of the same shape.

Why: the sweeps say where tunefw loses to cuBLAS, not why. Under Nsight Compute (run it with
--clock-control none: the clocks stay the GPU's own) this runs, per table entry, the tuned
kernel and then torch.mm (cuBLAS) a few times each, so that ncu can report both kernels' time,
DRAM and L2 bytes and throughputs, and the name of the kernel cuBLAS chose (its name encodes
its tile, stages and cluster shape). The script only launches; ncu writes a CSV, which
``--summarize`` (on any machine) turns into the result JSON, a row per shape.

    ncu --clock-control none --profile-from-start off --csv --page raw \
        --section SpeedOfLight --section LaunchStats \
        --metrics dram__bytes_read.sum,lts__t_bytes.sum,gpc__cycles_elapsed.avg.per_second \
        -k 'regex:^(gemm_|nvjet|sm[0-9]+_xmma|cutlass|splitKreduce|gemv|Kernel)' \
        python3 benchmarks/profile_h200.py --table T --shapes S > profile.csv

Only the timed launches run inside the profiler range (cudaProfilerStart/Stop): the runtime's
first-use proof of each kernel (its reference GEMM, norms and scans) runs before it, so ncu's
many replays per kernel are spent on the kernels compared.
    python3 benchmarks/profile_h200.py --table T --shapes S --summarize profile.csv --out R.json
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True, help="a dispatch.json")
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: every entry >= --min-gflop)")
    ap.add_argument("--min-gflop", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2, help="launches of each kernel per shape")
    ap.add_argument("--summarize", type=Path, metavar="CSV", help="turn ncu's CSV into --out JSON")
    ap.add_argument("--out", type=Path, help="result JSON (with --summarize)")
    ap.add_argument("--device", default="", help="'name, driver, power limit, max SM clock'")
    ap.add_argument("--script-commit", default="", help="the commit of this script that ran")
    ap.add_argument("--note", default="", help="what else a reader of the result must know")
    ap.add_argument("--any-route", action="store_true",
                    help="profile the tuned kernel of entries exported as cuBLAS routes too (why "
                         "a winner lost is the question there)")
    args = ap.parse_args()
    if args.summarize:
        result = summarize(args.summarize, args)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        for row in result["rows"]:
            print(f"{row['shape']}: tunefw {row['tunefw']['time_us']:.1f} us, cuBLAS "
                  f"{row['cublas']['time_us']:.1f} us ({', '.join(row['cublas']['kernels'])})")
        return 0

    import torch

    from table_gemms import table_gemms

    wanted = {tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s}

    def keep(e) -> bool:
        if wanted:
            return (e.M, e.N, e.K) in wanted
        return 2.0 * e.M * e.N * e.K >= args.min_gflop * 1e9

    table = kernel_routes(args.table) if args.any_route else args.table
    for g in table_gemms(table, keep):
        e = g.entry
        g.tunefw()  # first launches (and every check before them) outside the profiled range
        g.cublas()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(args.repeats):
            g.tunefw()
        for _ in range(args.repeats):
            g.cublas()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        err = float((g.c.float() - g.c_ref.float()).norm() / g.c_ref.float().norm())
        print(f"{e.M}x{e.N}x{e.K}: {e.config} rel diff vs cuBLAS {err:.2e}", flush=True)
    return 0


def kernel_routes(table_path: Path) -> Path:
    """A copy of the table whose cuBLAS routes are served by their tuned configs again."""
    import tempfile

    data = json.loads(table_path.read_text())
    for e in data["entries"]:
        if e.get("route") == "cublas" and e.get("config"):
            e.pop("route")
            e.pop("reason", None)
    out = Path(tempfile.mkdtemp()) / table_path.name
    out.write_text(json.dumps(data))
    return out


TUNEFW_KERNEL = "void gemm_"  # every family's kernel: gemm_<family>
# torch's and CUB's kernels (a check's norms and scans): not GEMM work; they end a launch's rows
FRAMEWORK_KERNELS = ("void at::", "void reduce::", "void scan::", "void select::")
METRICS = {"time_us": ("gpu__time_duration.sum", 1e-3), "dram_read_mb": ("dram__bytes_read.sum", 1e-6),
           "l2_mb": ("lts__t_bytes.sum", 1e-6), "sm_clock_mhz": ("gpc__cycles_elapsed.avg.per_second", 1e-6),
           "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
           "l2_throughput_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed", 1.0),
           "dram_throughput_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 1.0)}
# cycles the average SM had a CTA over the kernel's elapsed cycles: the launch ramp and the tail
# (CTAs done, others still running) are what keeps it under 100% on a one-wave grid
BUSY = ("sm__cycles_active.avg", "gpc__cycles_elapsed.max")


STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _side(launches: list[list[dict]]) -> dict:
    """Median over the launches of one side; a launch = its kernels (cuBLAS may add a reduce)."""
    out = {"kernels": [r["Kernel Name"] for r in launches[0]], "launches": len(launches),
           "grid": [int(_number(r["launch__grid_size"])) for r in launches[0]],
           "cluster": [int(_number(r.get("launch__cluster_dim_x") or "0") or 1) for r in launches[0]]}
    for key, (metric, scale) in METRICS.items():
        per_launch = []
        for kernels in launches:
            values = [_number(r.get(metric) or "nan") * scale for r in kernels]
            per_launch.append(sum(values) if key in ("time_us", "dram_read_mb", "l2_mb")
                              else max(values))
        out[key] = statistics.median(per_launch)
    if all(launches[0][0].get(m) for m in BUSY):
        out["sm_busy_pct"] = statistics.median(
            100.0 * max(_number(r[BUSY[0]]) / _number(r[BUSY[1]]) for r in kernels)
            for kernels in launches)
    stalls = {}  # with --section WarpStateStats: cycles a warp stalls per issued instruction
    for metric in launches[0][0]:
        if metric.startswith(STALL_PREFIX) and metric.endswith(STALL_SUFFIX):
            values = [max(_number(r.get(metric) or "nan") for r in kernels) for kernels in launches]
            stalls[metric[len(STALL_PREFIX):-len(STALL_SUFFIX)]] = round(statistics.median(values), 3)
    if stalls:
        out["stalls_per_issue"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:6])
    return out


def table_order(shapes: list[str], table_path: Path) -> list[str]:
    """The shapes in the order the launches ran: the table's entry order (table_gemms)."""
    from tunefw.runtime.dispatch import load

    index = {f"{e.M}x{e.N}x{e.K}": i for i, e in reversed(list(enumerate(load(table_path).entries)))}
    return sorted(shapes, key=lambda s: index.get(s, len(index)))


def launch_blocks(rows: list[dict]) -> list[list[dict]]:
    """The compared launches of each shape: a run of tunefw rows and the GEMM-library rows right
    after it. torch's and CUB's rows end a block, and a block without cuBLAS rows is dropped, so
    a CSV that also holds first-use checks (profiled from the start) parses as well."""
    blocks: list[list[dict]] = []
    ours: list[dict] = []
    theirs: list[dict] = []
    for r in rows + [{"Kernel Name": FRAMEWORK_KERNELS[0]}]:
        name = r["Kernel Name"]
        mine = name.startswith(TUNEFW_KERNEL)
        if name.startswith(FRAMEWORK_KERNELS) or (mine and theirs):
            if ours and theirs:
                blocks.append(ours + theirs)
            ours, theirs = [], []
        if mine:
            ours.append(r)
        elif not name.startswith(FRAMEWORK_KERNELS):
            theirs.append(r)
    return blocks


def summarize(csv_path: Path, args: argparse.Namespace) -> dict:
    """A row per shape: tunefw's and cuBLAS's kernels side by side (medians over launches).
    Rows come in launch order: per shape, tunefw x repeats, then cuBLAS x repeats."""
    lines = [ln for ln in csv_path.read_text().splitlines() if ln.startswith('"')]
    rows = [r for r in csv.DictReader(lines) if r.get("ID", "").isdigit()]
    blocks = launch_blocks(rows)
    shapes = table_order([s for s in args.shapes.split(",") if s], args.table)
    if len(shapes) != len(blocks):
        raise SystemExit(f"--shapes names {len(shapes)} shapes, the CSV holds {len(blocks)}")
    result_rows = []
    for shape, block in zip(shapes, blocks):
        mine = [[r] for r in block if r["Kernel Name"].startswith(TUNEFW_KERNEL)]
        theirs = [r for r in block if not r["Kernel Name"].startswith(TUNEFW_KERNEL)]
        per = len(theirs) // len(mine)  # kernels per cuBLAS call
        ref = [theirs[i:i + per] for i in range(0, len(theirs), per)]
        row = {"shape": shape, "tunefw": _side(mine), "cublas": _side(ref)}
        row["ratio"] = row["cublas"]["time_us"] / row["tunefw"]["time_us"]
        result_rows.append(row)
    return {"script": "benchmarks/profile_h200.py", "script_commit": args.script_commit,
            "date": datetime.date.today().isoformat(), "device": args.device,
            "table": str(args.table), "tool": "ncu --clock-control none (clocks left to the GPU)",
            "note": "ratio = cuBLAS time / tunefw time per GEMM, ncu-serialized launches "
                    "(caches flushed by ncu between kernels); cuBLAS time sums its kernels",
            "rows": result_rows, **({"run_note": args.note} if args.note else {})}


if __name__ == "__main__":
    sys.exit(main())
