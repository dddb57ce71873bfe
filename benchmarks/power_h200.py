"""Sustained speed, clock and power of each dispatch-table kernel beside cuBLAS (one GPU).

Why: on the H200 (700 W cap) the SM clock moves by about 8% within a second of 4096^3 load, and
the sweeps' 300 ms interleaved confirmations put wgmma_sm90 at 0.99-1.00 of cuBLAS on shapes
where 25 ms interleaved runs put it at 1.01. Under a power cap the faster kernel is the one that
spends less energy per GEMM; this measures it. Each kernel runs alone, back to back (as in an
application, no L2 flush) for --seconds, in the order tunefw, cuBLAS, tunefw, cuBLAS with an
idle second before each, while a thread reads NVML (SM clock, power draw, temperature) every
10 ms. Reported per run: TFLOP/s over the window after --settle seconds, mean clock and power
there, and joules per GEMM.

    python3 benchmarks/power_h200.py --table benchmarks/results/dispatch_wgmma_sm90_r3_h200.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BATCH_MS = 20.0  # launches per timed batch: at least this much kernel time


class NvmlSampler(threading.Thread):
    """(seconds, SM MHz, watts, deg C) every 10 ms until stopped."""

    def __init__(self, index: int = 0) -> None:
        super().__init__(daemon=True)
        import pynvml
        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        self.samples: list[tuple[float, int, float, int]] = []
        self.running = True

    def run(self) -> None:
        nv, h = self.nvml, self.handle
        while self.running:
            self.samples.append((time.perf_counter(), nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                 nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                                 nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
            time.sleep(0.01)

    def window(self, start: float, end: float) -> dict:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return {"sm_clock_mhz": None, "power_w": None, "temperature_c": None, "samples": 0}
        return {"sm_clock_mhz": statistics.mean(s[1] for s in inside),
                "power_w": statistics.mean(s[2] for s in inside),
                "temperature_c": max(s[3] for s in inside), "samples": len(inside)}


def sustained(launch, flops: float, seconds: float, settle: float, nvml: NvmlSampler) -> dict:
    """Run `launch` back to back for `seconds`; speed, clock and power after `settle` seconds."""
    import torch
    launch()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        launch()
    end.record()
    end.synchronize()
    per_ms = start.elapsed_time(end) / 5
    batch = max(1, int(BATCH_MS / max(per_ms, 1e-3)))
    batches: list[tuple[float, float, int]] = []  # (host time at sync, kernel ms, launches)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        start.record()
        for _ in range(batch):
            launch()
        end.record()
        end.synchronize()
        batches.append((time.perf_counter(), start.elapsed_time(end), batch))
    steady = [b for b in batches if b[0] - t0 >= settle] or batches
    ms = sum(b[1] for b in steady)
    n = sum(b[2] for b in steady)
    window = nvml.window(t0 + settle, batches[-1][0])
    per_gemm_s = ms / n / 1e3
    return {"tflops": flops * n / (ms / 1e3) / 1e12, "ms_per_gemm": per_gemm_s * 1e3,
            "joules_per_gemm": window["power_w"] * per_gemm_s if window["power_w"] else None,
            "launches": n, **window}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True, help="a dispatch.json (its entries' configs)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--settle", type=float, default=0.5)
    ap.add_argument("--idle", type=float, default=1.0, help="idle seconds before each run")
    ap.add_argument("--min-gflop", type=float, default=1.0, help="skip smaller entries")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from table_gemms import table_gemms

    nvml = NvmlSampler()
    nvml.start()
    rows = []
    for g in table_gemms(args.table, lambda e: 2.0 * e.M * e.N * e.K >= args.min_gflop * 1e9):
        e = g.entry
        runs = []
        for name in ("tunefw", "cublas", "tunefw", "cublas"):
            time.sleep(args.idle)
            runs.append({"kernel": name, **sustained(getattr(g, name), g.flops, args.seconds,
                                                     args.settle, nvml)})
        mine = [r for r in runs if r["kernel"] == "tunefw"]
        ref = [r for r in runs if r["kernel"] == "cublas"]
        def mean_of(rs: list[dict], key: str) -> float:
            return statistics.mean(r[key] for r in rs)
        row = {"M": e.M, "N": e.N, "K": e.K, "family": e.family, "config": e.config, "runs": runs,
               "ratio": mean_of(mine, "tflops") / mean_of(ref, "tflops")}
        if all(r["joules_per_gemm"] for r in runs):
            row["energy_ratio"] = mean_of(mine, "joules_per_gemm") / mean_of(ref, "joules_per_gemm")
        rows.append(row)
        write(args, rows, nvml, partial=True)  # a cut run keeps what it measured
        print(f"{e.M}x{e.N}x{e.K}: ratio {row['ratio']:.3f} energy {row.get('energy_ratio', 0):.3f}  "
              + "  ".join(f"{r['kernel']} {r['tflops']:.0f} TF/s {r['sm_clock_mhz'] or 0:.0f} MHz "
                          f"{r['power_w'] or 0:.0f} W" for r in runs), flush=True)
    nvml.running = False
    print(f"wrote {write(args, rows, nvml, partial=False)}")
    return 0


def write(args: argparse.Namespace, rows: list[dict], nvml: NvmlSampler, partial: bool) -> Path:
    import torch
    props = torch.cuda.get_device_properties(0)
    result = {"script": "benchmarks/power_h200.py", "date": datetime.date.today().isoformat(),
              "device": {"name": props.name, "driver": nvml.nvml.nvmlSystemGetDriverVersion(),
                         "power_limit_w": nvml.nvml.nvmlDeviceGetEnforcedPowerLimit(nvml.handle) / 1000,
                         "torch": torch.__version__, "cuda": torch.version.cuda},
              "table": str(args.table), "seconds": args.seconds, "settle": args.settle,
              "idle": args.idle, "partial": partial, "rows": rows}
    out = args.out or Path(os.environ.get("OUT", ".")) / "power_h200.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    return out


if __name__ == "__main__":
    sys.exit(main())
