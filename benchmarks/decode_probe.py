"""GPU probe of the decode families (skinny_sm90, stream_sm90, rows_sm90): HBM roofline, correctness over
edge shapes, and the best of a random sample per family and decode shape against cuBLAS in the
same run.

Every trial goes through the product's CUDA evaluator (NaN-poisoned C, fp32 reference per row,
anchored screen interleaved with cuBLAS; kernels under 20 us as CUDA graphs cycling over operand
copies past L2), in child worker processes with a watchdog (benchmarks/evaluator_gpu_check.py).
First the streaming-read bandwidth of >= 4 GB is measured, so every row's effective TB/s can be
read as a fraction of what this GPU streams today.

    PYTHONPATH=. python benchmarks/decode_probe.py --per-shape 24 --edge-configs 12 \
        [--families stream_sm90,skinny_sm90] [--m 1,4,16,32] [--name decode_probe] \
        [--wgmma-membound] [--wgmma-midm N]

Writes $OUT/<name>_h200.json (else benchmarks/results/).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks"), str(REPO / "tests")]

import gpu_result  # noqa: E402
from evaluator_gpu_check import run_jobs  # noqa: E402
from tunefw.cuda.compiler import CompilePool, compiler_info  # noqa: E402
from tunefw.device import H200  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.measure.roofline import stream_read_tbs  # noqa: E402
from tunefw.templates import get_family  # noqa: E402
from tunefw.tune.space import random_valid  # noqa: E402

LAYERS = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
DECODE_M = (1, 4, 16, 32, 64)
CHUNK = 200  # jobs per worker command line (Linux caps one argument at 128 KiB)
EDGE_SHAPES = ((1, 8, 8), (3, 24, 40), (17, 4104, 4104), (1, 4096, 14336), (7, 136, 264),
               (64, 8, 4096), (33, 4104, 520), (9, 1024, 4096), (57, 11008, 4096),
               (5, 4104, 4104), (16, 1000, 1032), (1, 40, 264), (11, 264, 72), (129, 136, 264),
               (200, 4096, 4096))


def sample(name: str, problem: GemmProblem, n: int, rng: random.Random) -> list[dict]:
    """The family's valid seeds for the problem, then up to n distinct random valid configs
    (tune.space.random_valid: drawn as far as read, never the whole space listed)."""
    family = get_family(name)
    configs = [c for c in family.seed_configs() if family.check(c, problem, H200) is None]
    for c in random_valid(family, rng, problem, H200):
        if len(configs) >= n:
            break
        if c not in configs:
            configs.append(c)
    return configs


# Weight-tile widths of the non-swapped memory-bound configs: 48 makes N = 6144 128 tiles (64
# makes 96, 27% of the SMs idle, and split-K 2 makes 192: two waves), 64-256 narrow to wide.
PLAIN_WIDTHS = (48, 64, 128, 256)


def membound_wgmma(problem: GemmProblem, depths: tuple[int, ...] = (64,),
                   clusters: tuple[int, ...] = (1, 2), swap_all_bm: bool = False) -> list[dict]:
    """wgmma_sm90 configs built for a memory-bound shape: one M tile (the smallest BM >= M the
    schedule allows, so each weight tile is read once; or under swap-AB the smallest BN >= M
    whose multicast half, on a 2-CTA cluster, is still a multiple of 8 rows),
    weight tiles from narrow to wide, split-K so that the tiles x splits fill the GPU, and deep
    rings; each also on a 2-CTA cluster that multicasts the activations (non-swapped: CLUSTER_N,
    the CTAs of one M tile and two weight tiles; swap-AB: CLUSTER_M). Every CTA re-reads the
    activations from L2 once per weight tile, so with narrow weight tiles the L2-to-SM traffic,
    not HBM, can bound the kernel: wide tiles and multicast cut it. Each at every stage depth
    BK of `depths` (128 and 256 load a weight row's stage as 2 or 4 adjacent 128-byte boxes:
    longer DRAM runs) and cluster size of `clusters`. Under swap-AB the weight rows a CTA holds
    are the schedule's smallest BM, or (``swap_all_bm``) each of its BMs: 256 rows halve the
    activation tile's re-reads from L2 against 128. The valid ones for the problem."""
    family = get_family("wgmma_sm90")
    base = family.seed_configs()[0]
    widths = sorted(next(p.values for p in family.params if p.name == "BN"))
    def tokens(cm: int) -> int | None:  # swap-AB: M on the N side, a multicast half of 8k rows
        return next((w for w in widths if w >= problem.M and (w // cm) % 8 == 0), None)

    shapes = []  # (swap, schedule, BM, BN, epilogue, cluster M, cluster N)
    for sched, bms in (("pingpong", (64, 128)), ("cooperative", (128, 256))):
        bm = next((b for b in bms if b >= problem.M), None)
        if bm is not None:
            shapes += [(0, sched, bm, bn, "tma" if bn % 32 == 0 else "direct", 1, cn)
                       for bn in PLAIN_WIDTHS for cn in clusters]
        shapes += [(1, sched, bm, tokens(cm), "direct", cm, 1)
                   for bm in (bms if swap_all_bm else bms[:1]) for cm in clusters
                   if tokens(cm) is not None]
    out = []
    for (swap, sched, bm, bn, epilogue, cm, cn), bk in itertools.product(shapes, depths):
        for split in (1, 2, 4, 8):
            for stages in (8, 6, 5, 4, 3, 2):
                c = {**base, "SCHEDULE": sched, "BM": bm, "BN": bn, "BK": bk, "SPLIT_K": split,
                     "STAGES": stages, "CLUSTER_M": cm, "CLUSTER_N": cn, "EPILOGUE": epilogue,
                     "SWAP_AB": swap}
                if family.check(c, problem, H200) is None:
                    out.append(c)
                    break  # the deepest ring that fits
    return out


SMS = H200.sm_count


def midm_wgmma(problem: GemmProblem, per_shape: int) -> list[dict]:
    """wgmma_sm90 configs chosen by arithmetic for a mid-M shape (M = 128-1024 against a
    Llama weight: balanced or tensor-bound, where the sweeps' best stayed 0.83-0.97x cuBLAS):
    tiles of at least 64 FLOP per byte of operand loaded into shared memory (128x128 and
    wider: narrower tiles ask the L2 for more than it delivers at the tensor rate), swapped or
    not, split-K 1-4, ranked by how full the waves of SMs are (and how much of the tile area
    lies inside C), then by tile intensity; each tile with every valid schedule, cluster (one
    or two CTAs) and epilogue at the deepest ring that fits, taken tile by tile (each tile's
    first kind, then each one's second, ...): ``per_shape`` configs. Whether
    the family's existing knobs can reach cuBLAS there with the right tile, or the kernel
    itself falls short: the answer decides where the next kernel work goes."""
    family = get_family("wgmma_sm90")
    base = family.seed_configs()[0]
    widths = [w for w in sorted(next(p.values for p in family.params if p.name == "BN"))
              if w >= 64]
    scored = []
    for swap, bm, bn, split in itertools.product((0, 1), (128, 256), widths, (1, 2, 4)):
        if swap and problem.M > 256:
            continue
        rows, cols = (problem.N, problem.M) if swap else (problem.M, problem.N)
        tiles = -(-rows // bm) * -(-cols // bn)
        ctas = tiles * split
        intensity = bm * bn / (bm + bn)  # FLOP per byte of A and B a k-step loads
        if intensity < 64 or ctas < SMS // 2:
            continue
        waves = -(-ctas // SMS)
        fill = ctas / (waves * SMS)
        useful = (rows * cols) / (tiles * bm * bn)  # of the tile area, inside C
        scored.append((-(fill * useful), -intensity, split, swap, bm, bn))
    variants = []  # per tile, best ranked first: its valid (schedule, cluster, epilogue) kinds
    for *_, split, swap, bm, bn in sorted(scored)[:4 * per_shape]:
        kinds = []
        for sched, (cm, cn), epilogue in itertools.product(
                ("cooperative", "pingpong"), ((1, 1), (2, 1), (1, 2)),
                ("tma", "tma_overlap", "direct")):
            for stages in (8, 7, 6, 5, 4, 3):
                c = {**base, "SCHEDULE": sched, "BM": bm, "BN": bn, "SPLIT_K": split,
                     "STAGES": stages, "CLUSTER_M": cm, "CLUSTER_N": cn, "EPILOGUE": epilogue,
                     "SWAP_AB": swap}
                if family.check(c, problem, H200) is None:
                    kinds.append(c)
                    break
        variants.append(kinds)
    out = []  # each tile's first kind, then each tile's second, ...: tiles before variants
    for round_ in itertools.zip_longest(*variants):
        out += [c for c in round_ if c is not None and c not in out]
    return out[:per_shape]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-shape", type=int, default=24)
    ap.add_argument("--edge-configs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="skinny_sm90")
    ap.add_argument("--m", default=",".join(map(str, DECODE_M)), help="decode M values")
    ap.add_argument("--name", default="decode_probe")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per job (watchdog)")
    ap.add_argument("--plan-only", action="store_true",
                    help="list the jobs per family and set, then stop (no GPU needed)")
    ap.add_argument("--wgmma-membound", action="store_true",
                    help="also every membound_wgmma() config of each decode shape")
    ap.add_argument("--membound-bk", default="64", help="stage depths BK of those configs")
    ap.add_argument("--membound-clusters", default="1,2", help="their cluster sizes")
    ap.add_argument("--membound-swap-all-bm", action="store_true",
                    help="swap-AB configs at every BM of their schedule, not the smallest only")
    ap.add_argument("--wgmma-midm", type=int, default=0, metavar="N",
                    help="also N midm_wgmma() configs of each layer at every --m (set 'midm')")
    ap.add_argument("--membound-edges", type=int, default=0, metavar="N",
                    help="up to N of those configs (drawn) on every edge shape too: the tails of "
                         "M, N and K verified")
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]  # "": the wgmma sets alone
    decode_m = [int(m) for m in args.m.split(",")]
    depths = tuple(int(v) for v in args.membound_bk.split(","))
    clusters = tuple(int(v) for v in args.membound_clusters.split(","))
    rng = random.Random(args.seed)

    jobs, meta = [], {}
    def add(kind: str, name: str, problem: GemmProblem, configs: list[dict], label: str) -> None:
        for config in configs:
            jid = len(jobs)
            jobs.append({"id": jid, "family": name, "config": config, "problem": problem.as_dict(),
                         "timeout_s": args.timeout, "kind": "screen"})
            meta[jid] = {"set": kind, "label": label, "family": name}
    for name in families:
        for m, n, k in EDGE_SHAPES:
            p = GemmProblem(m, n, k)
            add("edge", name, p, sample(name, p, args.edge_configs, rng), "edge")
        for label, (n, k) in LAYERS.items():
            for m in decode_m:
                p = GemmProblem(m, n, k)
                add("decode", name, p, sample(name, p, args.per_shape, rng), label)
    if args.membound_edges:
        for m, n, k in EDGE_SHAPES:
            p = GemmProblem(m, n, k)
            built = membound_wgmma(p, depths, clusters, args.membound_swap_all_bm)
            add("edge", "wgmma_sm90", p, rng.sample(built, min(args.membound_edges, len(built))),
                "edge")
    if args.wgmma_membound:
        for label, (n, k) in LAYERS.items():
            for m in decode_m:
                p = GemmProblem(m, n, k)
                add("decode", "wgmma_sm90", p, membound_wgmma(p, depths, clusters,
                                                                  args.membound_swap_all_bm), label)
    if args.wgmma_midm:
        for label, (n, k) in LAYERS.items():
            for m in decode_m:
                p = GemmProblem(m, n, k)
                add("midm", "wgmma_sm90", p, midm_wgmma(p, args.wgmma_midm), label)

    if args.plan_only:
        counts: dict = {}
        for j in jobs:
            key = (meta[j["id"]]["family"], meta[j["id"]]["set"])
            counts[key] = counts.get(key, 0) + 1
        print(f"{len(jobs)} jobs, {len({json.dumps([j['family'], j['config']], sort_keys=True) for j in jobs})} "
              f"distinct kernels: {counts}")
        return
    bandwidth = stream_read_tbs()
    cache_dir = os.environ.get("TUNEFW_CACHE_DIR") or tempfile.mkdtemp()
    unique = {json.dumps([j["family"], j["config"]], sort_keys=True): j for j in jobs}
    with CompilePool(os.cpu_count() or 4, cache_dir=cache_dir) as pool:  # compile ahead, all cores
        futures = [pool.submit(get_family(j["family"]), j["config"], "bf16", "sm_90a")
                   for j in unique.values()]
        compiled = [f.result() for f in futures]
    compile_failed = [r.log[:300] for r in compiled if not r.ok]
    outcomes, worker = {}, {}
    for start in range(0, len(jobs), CHUNK):  # the jobs travel on the worker's command line
        got, _, worker = run_jobs(jobs[start:start + CHUNK], cache_dir)
        outcomes.update(got)

    rows = []
    for job in jobs:
        o = outcomes.get(job["id"], {})
        p = GemmProblem(**job["problem"])
        ms = o.get("median_ms")
        rows.append({**meta[job["id"]], "M": p.M, "N": p.N, "K": p.K, "config": job["config"],
                     "status": o.get("status"), "log": (o.get("log") or "")[:200],
                     "median_ms": ms, "tflops": o.get("tflops"),
                     "cublas_tflops": o.get("cublas_tflops"),
                     "ratio": (o["tflops"] / o["cublas_tflops"]) if o.get("tflops") and o.get("cublas_tflops") else None,
                     "bytes": p.min_bytes, "tbs": p.min_bytes / (ms * 1e-3) / 1e12 if ms else None,
                     "cublas_tbs": (p.min_bytes / (o["cublas_median_ms"] * 1e-3) / 1e12
                                    if o.get("cublas_median_ms") else None),
                     "regs": o.get("regs")})
    best = {}
    for r in rows:
        if r["set"] not in ("decode", "midm") or r["status"] != "OK":
            continue
        key = (r["family"], r["M"], r["N"], r["K"])
        if key not in best or r["ratio"] > best[key]["ratio"]:
            best[key] = r
    report = {
        "script": "benchmarks/decode_probe.py", "date": datetime.date.today().isoformat(),
        "commit": gpu_result.commit(),
        "device": worker.get("fingerprint"), "compiler": compiler_info().label,
        "stream_read": bandwidth, "compile_failed": compile_failed,
        "wrong": sum(r["status"] == "WRONG_ANSWER" for r in rows),
        "status_counts": {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}},
        "best_by_shape": [{k: v for k, v in r.items() if k != "log"} for r in best.values()],
        "rows": rows,
    }
    out = gpu_result.out_path(f"{args.name}_h200.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    read = bandwidth["read_tbs_best"]
    print(f"stream read {read:.2f} TB/s (median {bandwidth['read_tbs_median']:.2f}), "
          f"copy {bandwidth['copy_tbs_best']:.2f}; statuses {report['status_counts']}; "
          f"compile failures {len(compile_failed)}")
    for r in rows:
        if r["status"] not in ("OK", None) and r["status"] != "INVALID":
            print("  ", r["status"], r["M"], r["N"], r["K"], json.dumps(r["config"]), r["log"][:120])
    print(f"{'family':>12} {'shape':>18} {'ratio':>6} {'TB/s':>5} {'%read':>5} {'cuBLAS TB/s':>11}  config")
    for r in sorted(best.values(), key=lambda r: (r["N"], r["K"], r["M"], r["family"])):
        print(f"{r['family']:>12} {r['M']:>5}x{r['N']:>5}x{r['K']:>5} {r['ratio']:6.3f} {r['tbs']:5.2f} "
              f"{100 * r['tbs'] / read:5.1f} {r['cublas_tbs']:11.2f}  {json.dumps(r['config'])}")


if __name__ == "__main__":
    main()
