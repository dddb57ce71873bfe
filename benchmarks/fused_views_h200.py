"""Where sibling fusion pays and where it costs: Llama-3-8B's q/k/v and gate/up as separate
GEMMs against one fused GEMM whose members are column views, each followed by what the model
does with them (RoPE on q and k; SiLU(gate) * up), all on cuBLAS and as CUDA graphs.

The fused H200 run (hf_llama_fused_h200.json) was faster at decode and slower at prefill 512 and
2048. The hypothesis this tests: the fused GEMM saves weight reads that matter only while the
GEMM is bandwidth-bound (few rows), while the views, rows strided by the summed N, make the
elementwise kernels that read them slower at any M (no vectorized loads), which dominates once
the weight read is amortized. Per M, each part is timed whole and split (GEMMs alone, the
elementwise alone on contiguous outputs or on views), stock-style and fused, interleaved.

    python3 benchmarks/fused_views_h200.py --commit SHA

Writes $OUT/fused_views_h200.json (else benchmarks/results/); prints a short table last.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpu_result  # noqa: E402

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128
M_VALUES = (1, 16, 64, 128, 256, 512, 2048)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF Llama's path for a projection's output: split heads, move them first, rotate."""
    x = x.view(1, -1, heads, HEAD_DIM).transpose(1, 2)
    return x * cos + rotate_half(x) * sin


def parts(m: int, dev: torch.device) -> dict[str, dict]:
    """Per part (mlp, qkv): the callables timed, stock-style (separate) and fused."""
    g = torch.Generator(device=dev).manual_seed(m)

    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    x = torch.randn(m, HIDDEN, device=dev, dtype=torch.bfloat16, generator=g)
    gate, up = w(INTER, HIDDEN), w(INTER, HIDDEN)
    gate_up = torch.cat([gate, up])
    q_w, k_w, v_w = w(HEADS * HEAD_DIM, HIDDEN), w(KV_HEADS * HEAD_DIM, HIDDEN), w(KV_HEADS * HEAD_DIM, HIDDEN)
    qkv_w = torch.cat([q_w, k_w, v_w])
    widths = [q_w.shape[0], k_w.shape[0], v_w.shape[0]]
    pos = torch.arange(m, device=dev, dtype=torch.float32)[:, None]
    freq = pos / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device=dev) / HEAD_DIM))
    ang = torch.cat([freq, freq], -1)
    cos, sin = ang.cos().to(torch.bfloat16)[None, None], ang.sin().to(torch.bfloat16)[None, None]
    sep = [F.linear(x, gate), F.linear(x, up)]  # outputs for the elementwise-alone timings
    fused_y = F.linear(x, gate_up)
    fused_views = [fused_y.narrow(-1, 0, INTER), fused_y.narrow(-1, INTER, INTER)]
    qkv_y = F.linear(x, qkv_w)
    qkv_views = list(qkv_y.split(widths, -1))
    qkv_sep = [F.linear(x, q_w), F.linear(x, k_w), F.linear(x, v_w)]

    def mlp_sep():
        return F.silu(F.linear(x, gate)) * F.linear(x, up)

    def mlp_fused():
        y = F.linear(x, gate_up)
        return F.silu(y.narrow(-1, 0, INTER)) * y.narrow(-1, INTER, INTER)

    def qkv_rope(q, k, v):
        return rope(q, HEADS, cos, sin), rope(k, KV_HEADS, cos, sin), v.view(1, -1, KV_HEADS, HEAD_DIM)

    def qkv_sep_all():
        return qkv_rope(F.linear(x, q_w), F.linear(x, k_w), F.linear(x, v_w))

    def qkv_fused_all():
        return qkv_rope(*F.linear(x, qkv_w).split(widths, -1))
    return {
        "mlp": {"separate": mlp_sep, "fused": mlp_fused,
                "gemm separate": lambda: (F.linear(x, gate), F.linear(x, up)),
                "gemm fused": lambda: F.linear(x, gate_up),
                "elementwise contiguous": lambda: F.silu(sep[0]) * sep[1],
                "elementwise views": lambda: F.silu(fused_views[0]) * fused_views[1]},
        "qkv": {"separate": qkv_sep_all, "fused": qkv_fused_all,
                "gemm separate": lambda: [F.linear(x, t) for t in (q_w, k_w, v_w)],
                "gemm fused": lambda: F.linear(x, qkv_w),
                "elementwise contiguous": lambda: qkv_rope(*qkv_sep),
                "elementwise views": lambda: qkv_rope(*qkv_views)},
    }


def graphed(fn, reps: int):
    """``fn`` captured ``reps`` times in one CUDA graph (no host cost in the timing)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return graph


def time_us(graphs: dict, reps: int, rounds: int) -> dict[str, float]:
    """Median microseconds per call of each graph, replayed in alternating order each round."""
    times: dict[str, list[float]] = {k: [] for k in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for name, graph in (list(graphs.items()) if r % 2 == 0 else list(graphs.items())[::-1]):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / reps)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default=",".join(map(str, M_VALUES)), help="rows (tokens) to time")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    dev = torch.device("cuda")
    report = {**gpu_result.report_header("benchmarks/fused_views_h200.py", args.commit),
              "what": "us per call, CUDA graphs, cuBLAS GEMMs (F.linear), medians of interleaved "
                      "rounds; fused_speedup = separate / fused", "rows": []}
    with torch.no_grad():
        for m in (int(v) for v in args.m.split(",")):
            reps = 20 if m <= 256 else 5
            for part, fns in parts(m, dev).items():
                us = time_us({k: graphed(f, reps) for k, f in fns.items()}, reps, args.rounds)
                report["rows"].append({"M": m, "part": part, "us": us,
                                       "fused_speedup": us["separate"] / us["fused"],
                                       "gemm_speedup": us["gemm separate"] / us["gemm fused"],
                                       "views_cost": us["elementwise views"] / us["elementwise contiguous"]})
                torch.cuda.empty_cache()
    report["nvidia_smi_end"] = gpu_result.smi()
    gpu_result.write(report, gpu_result.out_path("fused_views_h200.json", args.out))
    print(f"{'M':>5s} {'part':4s} {'separate':>9s} {'fused':>9s} {'speedup':>8s} "
          f"{'gemm x':>7s} {'views/contig':>12s}   (us, graphs)")
    for r in report["rows"]:
        print(f"{r['M']:5d} {r['part']:4s} {r['us']['separate']:9.1f} {r['us']['fused']:9.1f} "
              f"{r['fused_speedup']:8.3f} {r['gemm_speedup']:7.3f} {r['views_cost']:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
