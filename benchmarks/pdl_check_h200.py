"""Programmatic launches on the GPU: are chained tunefw GEMMs still exact, and what do they save?

A chain feeds each GEMM's output to the next (an MLP's up and down projections of Llama-3-8B,
N x K = 14336 x 4096 then 4096 x 14336, at M the model table has exact entries for), with a small
torch kernel between some links writing the next input in place, and nothing kept alive between:
the caching allocator hands a GEMM's output the memory its predecessor's input had, so a kernel
that read its activations or wrote C before its griddepcontrol.wait would show. The chain runs
served by two dispatchers over the same table, one launching programmatically and one not; the
kernels and operands are the same, so the outputs must agree bit for bit (eagerly and replayed
from CUDA graphs, many times), and both must match an fp32 reference of the chain to bf16
rounding. Then both chains are timed as graphs, interleaved: the programmatic launches' gain.

    source benchmarks/device_setup.sh && python3 benchmarks/pdl_check_h200.py --commit SHA

Reads the model table from benchmarks/state/hf_llama3_8b_state.tar.gz (its kernels compiled
here); writes $OUT/pdl_check_h200.json (else benchmarks/results/) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import gpu_result  # noqa: E402
import torch  # noqa: E402

import tunefw  # noqa: E402
from hf_llama_steps import interleaved  # noqa: E402

UP, DOWN = (14336, 4096), (4096, 14336)  # (N, K) of the chain's two links
LINKS = 8  # up, down, up, down, ...
# A graph's first node: a copy of the input, or the chain's first GEMM (its input made outside
# the capture). The first run (7e4e1c9) captured only the second way and its programmatic graphs
# differed from the plain ones at every M; the second (92dac4f) only the first way, and agreed.
HEADS = ("copy", "gemm")


def chain(dispatcher: tunefw.Dispatcher, x: torch.Tensor, weights: list[torch.Tensor],
          scale: bool = True) -> torch.Tensor:
    """x through every weight in turn (dispatcher.gemm), scaled in place after every other link
    (``scale=False``: GEMMs back to back, nothing between them)."""
    for i, w in enumerate(weights):
        x = dispatcher.gemm(x, w)
        if scale and i % 2 == 0:
            x.mul_(0.5)  # a torch kernel writes the next GEMM's input in place
    return x


def captured(fn) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """fn() captured in a CUDA graph, and the graph's output tensor."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def replays(graph: torch.cuda.CUDAGraph, out: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The graph's output after each of ``n`` replays."""
    got = []
    for _ in range(n):
        graph.replay()
        got.append(out.clone())
    return got


def graph_input(x: torch.Tensor, head: str) -> torch.Tensor:
    """The chain's input inside a capture: a copy made in the graph (its first node a copy),
    or ``x`` itself (its first node the first GEMM)."""
    return x.clone() if head == "copy" else x


def localize(pdl: tunefw.Dispatcher, x: torch.Tensor, weights: list[torch.Tensor], head: str,
             scale: bool) -> dict:
    """Where a programmatic graph first parts from the same chain run eagerly: each prefix of
    the chain captured alone, replayed 5 times, compared with its eager output bit for bit."""
    by_links = {}
    for links in range(1, len(weights) + 1):
        eager = chain(pdl, x, weights[:links], scale)
        graph, out = captured(lambda: chain(pdl, graph_input(x, head), weights[:links], scale))
        got = replays(graph, out, 5)
        by_links[links] = {"equal_eager": sum(torch.equal(g, eager) for g in got),
                           "max_abs_diff": max((g.float() - eager.float()).abs().max().item()
                                               for g in got)}
        del graph
    return by_links


def reference(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """The same chain in fp32 from the same bf16 operands, each link rounded to bf16."""
    for i, w in enumerate(weights):
        x = torch.nn.functional.linear(x.float(), w.float()).to(torch.bfloat16)
        if i % 2 == 0:
            x.mul_(0.5)
    return x


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(out.float() - ref.float())
            / torch.linalg.vector_norm(ref.float())).item()


def graph_check(graphs: dict, plain: torch.Tensor, fast: torch.Tensor, ref: torch.Tensor,
                repeats: int) -> dict:
    """The serial and programmatic graphs replayed ``repeats`` times each: whether they agree
    bit for bit, the serial one with the eager chain, and if not, what the programmatic one is."""
    outs = {name: replays(graph, out, repeats) for name, (graph, out) in graphs.items()}
    pdl_graph = outs["programmatic"]
    return {
        "bitwise_graph": all(torch.equal(a, b) for a, b in zip(outs["serial"], pdl_graph)),
        "graph_equals_eager": torch.equal(outs["serial"][0], plain),
        "serial_replays_agree": all(torch.equal(g, plain) for g in outs["serial"]),
        "programmatic_replays_agree": all(torch.equal(g, pdl_graph[0]) for g in pdl_graph),
        "programmatic_graph_equals_eager": sum(torch.equal(g, fast) for g in pdl_graph),
        "programmatic_graph_rel_err_vs_fp32_chain": max(rel_err(g, ref) for g in pdl_graph),
        "differing_elements": max(int((g != fast).sum().item()) for g in pdl_graph),
        "elements": fast.numel(),
    }


def run_m(m: int, serial: tunefw.Dispatcher, pdl: tunefw.Dispatcher, repeats: int,
          rounds: int) -> dict:
    """One M: bitwise agreement eager and graphed over ``repeats`` runs, the reference error,
    the routes, and the two chains timed as graphs (``rounds`` interleaved rounds)."""
    gen = torch.Generator(device="cuda").manual_seed(m)
    weights = [torch.randn(*(UP if i % 2 == 0 else DOWN), device="cuda", generator=gen)
               .mul_(0.02).to(torch.bfloat16) for i in range(LINKS)]
    x = torch.randn(m, UP[1], device="cuda", generator=gen).to(torch.bfloat16)
    routes = {f"{m}x{n}x{k}": serial.explain(m, n, k) for n, k in (UP, DOWN)}
    plain, fast = chain(serial, x, weights), chain(pdl, x, weights)  # first calls: plans built
    ref = reference(x, weights)
    eager_same = all(torch.equal(chain(serial, x, weights), chain(pdl, x, weights))
                     for _ in range(repeats))
    graphs, heads = {}, {}
    for head in HEADS:
        graphs[head] = {name: captured(lambda d=d: chain(d, graph_input(x, head), weights))
                        for name, d in (("serial", serial), ("programmatic", pdl))}
        heads[head] = graph_check(graphs[head], plain, fast, ref, repeats)
        if not heads[head]["bitwise_graph"]:
            heads[head]["prefixes"] = localize(pdl, x, weights, head, True)
            heads[head]["prefixes_no_torch_kernel"] = localize(pdl, x, weights, head, False)
    timed = interleaved(graphs["copy"]["serial"][0].replay,
                        graphs["copy"]["programmatic"][0].replay, rounds, 20, True)
    return {"M": m, "routes": routes, "bitwise_eager": eager_same and torch.equal(plain, fast),
            "bitwise_graph": all(h["bitwise_graph"] for h in heads.values()),
            "graph_equals_eager": all(h["graph_equals_eager"] for h in heads.values()),
            "rel_err_vs_fp32_chain": rel_err(fast, ref), "graph_heads": heads,
            "programmatic_plans": pdl.programmatic,
            "serial_ms": timed["stock"], "programmatic_ms": timed["patched"],
            "speedup": timed["speedup"], "rounds": rounds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=Path,
                    default=REPO / "benchmarks/state/hf_llama3_8b_state.tar.gz")
    ap.add_argument("--m", default="1,16,512",
                    help="tokens: the model table's exact M (1 and 16: rows_sm90 and stream_sm90 "
                         "links, 512: a wgmma_sm90 link; the others cuBLAS routes)")
    ap.add_argument("--repeats", type=int, default=50, help="chains compared bit for bit per mode")
    ap.add_argument("--rounds", type=int, default=21, help="interleaved timing rounds")
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = Path("/tmp/pdl_check")
    with tarfile.open(args.state) as f:
        f.extractall(work, filter="data")
    table = work / "dispatch.json"  # compiled from this tree's sources: kernels that wait
    serial = tunefw.Dispatcher(table, programmatic=False, guard=False)
    pdl = tunefw.Dispatcher(table, programmatic=True, guard=False)
    rows = [run_m(int(m), serial, pdl, args.repeats, args.rounds) for m in args.m.split(",")]
    ok = all(r["bitwise_eager"] and r["bitwise_graph"] and r["graph_equals_eager"]
             and r["rel_err_vs_fp32_chain"] < 1e-2 for r in rows)
    report = {**gpu_result.report_header("benchmarks/pdl_check_h200.py", args.commit),
              "chain": {"links": LINKS, "up": UP, "down": DOWN}, "rows": rows, "all_ok": ok}
    out = gpu_result.out_path("pdl_check_h200.json", args.out)
    out.write_text(json.dumps(report, indent=1))
    print(f"{'M':>4} {'bitwise eager/graph':>20} {'rel err':>9} {'serial ms':>10} {'pdl ms':>8} "
          f"{'speedup':>8}")
    for r in rows:
        print(f"{r['M']:>4} {str(r['bitwise_eager']) + '/' + str(r['bitwise_graph']):>20} "
              f"{r['rel_err_vs_fp32_chain']:9.2e} {r['serial_ms']['median_ms']:10.4f} "
              f"{r['programmatic_ms']['median_ms']:8.4f} {r['speedup']['median']:8.3f}")
    print("all ok" if ok else "FAILED", "->", out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
