"""Run a streaming microbenchmark of benchmarks/micro/ on the GPU and write its result. They
guide the decode kernels' design; they are not GEMM results.

  stream_bw (default): which way of reading a weight once (TMA 2D boxes, 1D bulk copies, plain
      loads), with how many bytes in flight and how many CTAs, gets closest to HBM bandwidth
      -> stream_micro_h200.json
  l2_reuse: what a CTA's L2-hot second operand (the activation tile every CTA re-reads, plain
      or multicast to a 2-CTA cluster) costs while it streams its weight rows once, and what
      deeper stages (2 or 4 adjacent boxes a row), a pre-packed weight (one 1D bulk copy a
      stage) and two CTAs an SM save
      -> l2_reuse_h200.json (--occ: only the two-CTA variants -> l2_reuse_occ_h200.json)

Build here (nvcc 13.0), then carry benchmarks/micro/build:
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Ikernel_templates \
        -Ikernel_templates/include benchmarks/micro/NAME.cu -o benchmarks/micro/build/NAME
GPU: python3 benchmarks/stream_micro_h200.py [--micro NAME]   (writes $OUT/..., else
benchmarks/results/; the commit from git, else $TUNEFW_COMMIT)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BUILD = REPO / "benchmarks" / "micro" / "build"
RESULTS = {"stream_bw": "stream_micro_h200.json", "l2_reuse": "l2_reuse_h200.json"}


def device() -> dict:
    """GPU, driver and clocks as nvidia-smi reports them now."""
    fields = "name,uuid,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()[0]
    return dict(zip(fields.split(","), [v.strip() for v in out.split(",")]))


def best_stream(rows: list[dict]) -> dict:
    """stream_bw: the fastest row per (shape, variant)."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["variant"] == "null":
            continue
        key = f'{r["N"]}x{r["K"]}/{r["variant"]}'
        if key not in best or r["tbs"] > best[key]["tbs"]:
            best[key] = r
    return best


def reuse_slowdown(rows: list[dict]) -> dict:
    """l2_reuse: per (shape, R, stage depth KB, packed or not, MC, CTAs an SM), each RA's time
    over the 64-deep TMA-box stream's alone at one CTA an SM (KB 1, PACK 0, RA 0, MC 1, OCC 1):
    what deeper stages, the packed weight, two CTAs an SM and the activations each cost or save
    against that."""
    alone = {(r["N"], r["K"], r["R"]): r["us"] for r in rows
             if r["RA"] == 0 and r.get("KB", 1) == 1 and not r.get("PACK", 0)
             and r.get("OCC", 1) == 1}
    table: dict[str, dict] = defaultdict(dict)
    for r in rows:
        base = alone.get((r["N"], r["K"], r["R"]))
        if base:
            key = (f'{r["N"]}x{r["K"]}/R{r["R"]}/KB{r.get("KB", 1)}/P{r.get("PACK", 0)}'
                   f'/MC{r["MC"]}/OCC{r.get("OCC", 1)}')
            table[key][f'RA{r["RA"]}'] = round(r["us"] / base, 3)
    return dict(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", choices=sorted(RESULTS), default="stream_bw")
    parser.add_argument("--occ", action="store_true",
                        help="l2_reuse: only the two-CTAs-an-SM variants and their baselines")
    args = parser.parse_args()
    micro = args.micro
    name = "l2_reuse_occ_h200.json" if args.occ else RESULTS[micro]
    try:  # a hung kernel (a multicast protocol bug) costs two minutes, not the device call
        lines = subprocess.run([str(BUILD / micro), "30", *(["occ"] if args.occ else [])],
                               capture_output=True, text=True, check=True, timeout=120).stdout
    except subprocess.TimeoutExpired as hung:
        out = hung.stdout or b""  # bytes on POSIX even in text mode
        lines = (out.decode() if isinstance(out, bytes) else out) + '\n{"hung": true}'
    rows = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
    hung = any(r.get("hung") for r in rows)
    rows = [r for r in rows if not r.get("hung")]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip() or os.environ.get("TUNEFW_COMMIT")
    summary = best_stream(rows) if micro == "stream_bw" else reuse_slowdown(rows)
    result = {"script": "benchmarks/stream_micro_h200.py", "micro": f"benchmarks/micro/{micro}.cu",
              "date": datetime.date.today().isoformat(), "commit": commit or None,
              "device": device(), "hung_after_rows": len(rows) if hung else None, "rows": rows,
              ("best" if micro == "stream_bw" else "time_over_pure_stream"): summary}
    out_dir = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    (out_dir / name).write_text(json.dumps(result, indent=1))
    for key, value in sorted(summary.items()):
        if micro == "stream_bw":
            extra = {k: v for k, v in value.items() if k not in ("variant", "N", "K", "us", "tbs")}
            print(f"{key:24s} {value['us']:8.2f} us {value['tbs']:6.3f} TB/s  {extra}")
        else:
            print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
