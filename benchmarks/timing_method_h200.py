"""How the timing method moves decode-GEMM figures: one kernel and cuBLAS on the same operands,
timed interleaved under five methods, on the H200.

- ``write-single``: each launch alone between CUDA events after an L2 flush that writes a
  buffer twice the L2 (the method up to anchored-2 for kernels over 20 us);
- ``read-single``: the same after a flush that reads that buffer (no dirty lines left);
- ``write-graph`` / ``read-graph``: CUDA graphs of back-to-back launches cycling over operand
  copies past L2 (as a served model reads each layer's weight after the others), one flush
  before each graph.

    PYTHONPATH=. python benchmarks/timing_method_h200.py --commit SHA [--table T.json]

Kernels come from a dispatch table (default benchmarks/results/dispatch_decode3_h200.json)
plus the best rows_sm90/stream_sm90 configs of rows_probe3_h200.json. Writes
$OUT/timing_method_h200.json (else benchmarks/results/).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from tunefw.evaluate import method  # noqa: E402
from tunefw.evaluate.cuda import CudaEvaluator  # noqa: E402
from tunefw.measure.roofline import stream_read_tbs  # noqa: E402
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, load  # noqa: E402
from tunefw.runtime.dispatcher import Dispatcher  # noqa: E402
from tunefw.runtime.plan import current_stream  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (1, 6144, 4096), (16, 6144, 4096),
          (1, 28672, 4096), (16, 28672, 4096), (1, 4096, 14336), (16, 4096, 14336),
          (8, 4096, 4096), (8, 28672, 4096), (128, 6144, 4096), (4096, 4096, 4096)]
METHODS = ("write-single", "read-single", "write-graph", "read-graph")


class WriteFlush(method.L2Flush):
    """The flush up to anchored-2: writes the buffer (leaves the L2 dirty)."""

    def __call__(self) -> None:
        self.buffer.zero_()


def candidates(table: DispatchTable, probe: list[dict], shape: tuple[int, int, int]) -> list[DispatchEntry]:
    """The table's exact entry and the probe's best rows/stream configs for the shape."""
    out = [e for e in table.entries if (e.M, e.N, e.K) == shape and not e.is_cublas]
    for row in probe:
        if (row["M"], row["N"], row["K"]) == shape and row["status"] == "OK":
            out.append(DispatchEntry(*shape, "bf16", "TN", row["family"], row["config"],
                                     row["tflops"], row["cublas_tflops"], -1, "probe"))
    return out


def timed(kernel, anchor, flush, wait, per_sample: int) -> tuple[float, float]:
    k, c = method.interleaved(kernel, anchor, flush, wait, min_launches=20, min_ms=40.0,
                              warmup_ms=20.0, launches_per_sample=per_sample)
    return k.median_ms * 1e3, c.median_ms * 1e3


def measure(entry: DispatchEntry, fingerprint: dict, l2: int, flushes: dict) -> dict:
    """Times (us) of the entry's kernel and cuBLAS under every method."""
    M, N, K = entry.M, entry.N, entry.K
    a, b = method.make_inputs(M, N, K, "bf16", 0, device="cuda")
    table = DispatchTable(False, fingerprint, [entry])
    plan = Dispatcher(table).plan_for(a, b)
    copies = [(a, b)] + [(a.clone(), b.clone()) for _ in
                         range(method.rotation_copies((a.numel() + b.numel()) * 2, l2) - 1)]
    c = torch.empty(M, N, dtype=a.dtype, device="cuda")
    # The stream is read at each call: graph capture runs on a side stream.
    runs = [lambda p=plan.args(x.data_ptr(), y.data_ptr(), c.data_ptr()): plan.launch(p, current_stream(0))
            for x, y in copies]
    blas = [lambda x=x, y=y: torch.mm(x, y.t(), out=c) for x, y in copies]
    runs[0]()
    torch.cuda.synchronize()
    ref = method.reference(a, b)
    verdict = method.verify(c.clone(), ref, "bf16", baseline=torch.mm(a, b.t()))
    wait = torch.cuda.synchronize
    row = {"M": M, "N": N, "K": K, "family": entry.family, "config": entry.config,
           "source": entry.label or "table", "ok": verdict.ok, "bytes": (M * K + N * K + M * N) * 2}
    single_us, _ = timed(runs[0], blas[0], flushes["read"], wait, 1)
    repeats = method.graph_repeats(single_us / 1e3)
    for name in METHODS:
        kind, how = name.split("-")
        flush = flushes[kind]
        if how == "graph":
            k, cb = timed(method.capture_graph(runs, repeats), method.capture_graph(blas, repeats),
                          flush, wait, repeats)
        else:
            k, cb = timed(runs[0], blas[0], flush, wait, 1)
        row[name] = {"us": k, "cublas_us": cb, "ratio": cb / k,
                     "tbs": row["bytes"] / k / 1e6, "cublas_tbs": row["bytes"] / cb / 1e6}
    row["graph_launches"] = repeats
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", required=True)
    ap.add_argument("--table", default=str(RESULTS / "dispatch_decode3_h200.json"))
    ap.add_argument("--probe", default=str(RESULTS / "rows_probe3_h200.json"))
    args = ap.parse_args()
    table = load(args.table)
    probe = json.loads(Path(args.probe).read_text())["best_by_shape"]
    evaluator = CudaEvaluator(0)  # 1 s of warm-up; the fingerprint (driver, clocks, power)
    l2 = evaluator.device_spec().l2_bytes
    flushes = {"write": WriteFlush(l2), "read": method.L2Flush(l2)}
    read = stream_read_tbs()
    rows = []
    for shape in SHAPES:
        for entry in candidates(table, probe, shape) or [None]:
            if entry is None:
                continue
            rows.append(measure(entry, table.fingerprint, l2, flushes))
            r = rows[-1]
            print(f"{r['M']}x{r['N']}x{r['K']} {r['family']:<12} {r['source']:<6} ok={r['ok']} "
                  + " ".join(f"{m}={r[m]['us']:.1f}/{r[m]['cublas_us']:.1f}" for m in METHODS),
                  flush=True)
    result = {"script": "benchmarks/timing_method_h200.py", "commit": args.commit,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": evaluator.fingerprint(),
              "stream_read": read, "methods": METHODS, "rows": rows}
    out = Path(os.environ.get("OUT") or RESULTS) / "timing_method_h200.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"\n{'shape':<16} {'family':<12}" + "".join(f"{m:>14}" for m in METHODS))
    for r in rows:
        print(f"{r['M']}x{r['N']}x{r['K']:<8} {r['family']:<12}"
              + "".join(f"{r[m]['ratio']:>8.3f}/{r[m]['tbs']:.2f}" for m in METHODS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
