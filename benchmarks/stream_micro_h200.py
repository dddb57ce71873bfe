"""Run the streaming-read microbenchmark (benchmarks/micro/stream_bw.cu) on the GPU and write
its result: which way of reading a weight once (TMA 2D boxes, 1D bulk copies, plain loads), with
how many bytes in flight and how many CTAs, gets closest to HBM bandwidth. It guides the decode
kernels' design; it is not a GEMM result.

Build here (nvcc 13.0): nvcc -O3 -std=c++17 -arch=sm_90a -Ikernel_templates \
    -Ikernel_templates/include benchmarks/micro/stream_bw.cu -o benchmarks/micro/build/stream_bw
GPU: python3 benchmarks/stream_micro_h200.py   (writes $OUT/stream_micro_h200.json, else
benchmarks/results/)
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BINARY = REPO / "benchmarks" / "micro" / "build" / "stream_bw"


def device() -> dict:
    """GPU, driver and clocks as nvidia-smi reports them now."""
    fields = "name,uuid,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()[0]
    return dict(zip(fields.split(","), [v.strip() for v in out.split(",")]))


def main() -> None:
    lines = subprocess.run([str(BINARY), "30"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
    best: dict[str, dict] = {}
    for r in rows:
        if r["variant"] == "null":
            continue
        key = f'{r["N"]}x{r["K"]}/{r["variant"]}'
        if key not in best or r["tbs"] > best[key]["tbs"]:
            best[key] = r
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    result = {"script": "benchmarks/stream_micro_h200.py", "date": datetime.date.today().isoformat(),
              "commit": commit or None, "device": device(), "rows": rows, "best": best}
    out_dir = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    (out_dir / "stream_micro_h200.json").write_text(json.dumps(result, indent=1))
    for key, r in sorted(best.items()):
        extra = {k: v for k, v in r.items() if k not in ("variant", "N", "K", "us", "tbs")}
        print(f"{key:24s} {r['us']:8.2f} us {r['tbs']:6.3f} TB/s  {extra}")


if __name__ == "__main__":
    main()
