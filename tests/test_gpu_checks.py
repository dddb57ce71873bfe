"""benchmarks/mma_sm80_gpu_check.py and wgmma_sm90_gpu_check.py without a GPU: their plans (valid
jobs of `tunefw verify`'s kind, every kernel path), the peak kernel's compile through tunefw's
compiler and its arithmetic, and how each builds its result file from verify results."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
import tempfile
from pathlib import Path

import pytest

from tunefw.cuda.compiler import compile_kernel
from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import get_family

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
DEVICE = {"name": "NVIDIA H200", "uuid": "GPU-1", "driver": "580.159.04", "sm_clock_mhz": 1980,
          "power_limit_w": 700.0, "compiler": "nvrtc 13.0"}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mma = _load("mma_sm80_gpu_check")
wgmma = _load("wgmma_sm90_gpu_check")


def _row(job, status="OK", **figures) -> dict:
    """A `tunefw verify` result row for a planned job."""
    return {"family": job.family, "config": job.config, **job.problem.as_dict(),
            "source": job.source, "status": status, "log": "x" if status != "OK" else "",
            "rel_err": 1e-3, **figures}


def _result(rows: list[dict]) -> dict:
    return {"device": DEVICE, "rows": rows, "wrong": sum(r["status"] == "WRONG_ANSWER" for r in rows),
            "statuses": {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}}}


def test_the_mma_plan_forces_every_path_and_every_job_is_valid():
    jobs = mma.correctness_jobs(H200, n_random=10)
    assert all(mma.T.check(j.config, j.problem, H200) is None for j in jobs)
    forced = {int(j.source.split()[1]) for j in jobs if j.source.startswith("forced")}
    assert forced == set(range(len(mma.FORCED)))  # each path runs on some shape
    assert {j.config["SPLIT_K"] for j in jobs} >= {1, 2, 4, 8, 16}
    assert {j.problem.dtype for j in jobs} == {"bf16", "fp16"}
    assert sum(j.source == "random" for j in jobs) >= 10
    assert mma.correctness_jobs(H200, 10) == jobs  # seeded
    timing = mma.timing_jobs(H200)
    assert {(j.problem.M, j.problem.N, j.problem.K) for j in timing} == set(mma.TIMING_SHAPES)


def test_the_peak_kernel_compiles_through_tunefws_compiler_from_the_repository_root():
    result = compile_kernel(mma.PEAK, {"CHAINS": 4}, "bf16", "sm_80",
                            cache_dir=tempfile.mkdtemp(), source_dir=mma.REPO)
    assert result.ok, result.log
    assert result.lowered_name == "_Z8mma_peakILi0ELi4EEvPfi"
    # the hash that keys its cache covers the project header it includes
    assert [p.name for p in mma.PEAK.source_paths(mma.REPO)] == ["mma_peak.cuh", "sm80.cuh"]


def test_the_peak_rate_counts_every_warps_mmas():
    launch = mma.peak_launch(132)
    assert launch.grid == (528, 1, 1) and launch.block == (256, 1, 1)
    flops = 528 * 8 * mma.PEAK_MMAS_PER_WARP * 2 * 16 * 8 * 16
    assert mma.peak_tflops(launch, 8, 2.0) == pytest.approx(flops / 2e-3 / 1e12)


def test_the_mma_result_ranks_timings_by_ratio_and_lists_failures():
    corr = mma.correctness_jobs(H200, n_random=5)
    timing = [j for j in mma.timing_jobs(H200) if j.problem.M == 4096][:2]
    corr_rows = [_row(j) for j in corr]
    corr_rows[3] = _row(corr[3], "WRONG_ANSWER")
    timed = [_row(timing[0], tflops=600.0, cublas_tflops=700.0, ratio=600 / 700, median_ms=0.23,
                  min_ms=0.22),
             _row(timing[1], tflops=720.0, cublas_tflops=700.0, ratio=720 / 700, median_ms=0.19,
                  min_ms=0.18)]
    parts = {"correctness": _result(corr_rows), "timing": _result(timed),
             "peak": {"rows": [{"dtype": "bf16", "chains": 8, "status": "OK", "tflops": 655.5},
                               {"dtype": "fp16", "chains": 4, "status": "OK", "tflops": 640.0}]}}
    result = mma.compose(parts, "abc123", 0.0)
    assert [r["tflops"] for r in result["rows"]] == [720.0, 600.0]
    assert result["mma_sync_peak_tflops"] == 655.5 and result["commit"] == "abc123"
    assert result["correctness"]["wrong"] == 1 and not result["all_ok"]
    assert result["correctness"]["failures"][0]["config"] == corr[3].config
    assert result["device"]["sm_clock_mhz"] == 1980
    assert json.loads(json.dumps(result)) == result
    broken = mma.compose({**parts, "peak": {"error": "RuntimeError: x"}}, None, 0.0)
    assert broken["mma_sync_peak_tflops"] == 0.0 and "error" in broken["parts"]["peak"]


def test_the_wgmma_plan_runs_each_config_where_check_allows_and_says_where_not():
    jobs, refused = wgmma.plan_verify(H200)
    assert all(wgmma.T.check(j.config, j.problem, H200) is None for j in jobs)
    assert all(wgmma.T.check(r["config"], GemmProblem(*r["shape"], dtype=r["dtype"]), H200) == r["reason"]
               for r in refused)
    assert len(jobs) + len(refused) == len(wgmma.correctness_configs()) * len(wgmma.EDGE_SHAPES)
    assert {j.source for j in jobs} == {"pingpong", "split", "coop"}
    assert {j.config["PERSISTENT"] for j in jobs} == {0, 1}  # strict verify adds the small grid
    only = wgmma.plan_perf(H200, "128x6144x4096")
    assert only and {(j.problem.M, j.problem.N) for j in only} == {(128, 6144)}


def test_a_kernel_that_fails_its_sass_check_is_not_run():
    jobs, _ = wgmma.plan_verify(H200)
    bad = wgmma.T.name_expression(jobs[0].config, jobs[0].problem.dtype)
    kept = wgmma.runnable(jobs, {bad: "SASS touches local memory"})
    assert kept and all(wgmma.T.name_expression(j.config, j.problem.dtype) != bad for j in kept)
    assert len(kept) < len(jobs)


def test_the_wgmma_result_groups_shapes_per_config_and_finds_each_knobs_best():
    jobs, refused = wgmma.plan_verify(H200)
    first = [j for j in jobs if j.config == jobs[0].config and j.problem.dtype == jobs[0].problem.dtype]
    rows = [_row(j) for j in jobs]
    rows[len(first) - 1] = _row(first[-1], "WRONG_ANSWER")
    perf = wgmma.plan_perf(H200, "4096x4096x4096")
    timed = [_row(j, tflops=700.0 + i, cublas_tflops=700.0, ratio=(700.0 + i) / 700)
             for i, j in enumerate(perf)]
    parts = {"verify": _result(rows), "perf": _result(timed)}
    result = wgmma.compose(parts, refused, {}, "abc123", 0.0)
    assert result["wrong"] == 1 and result["runs_checked"] == len(jobs)
    bad = [c for c in result["correctness"] if c["status"] != "OK"]
    assert len(bad) == 1 and bad[0]["config"] == first[0].config and len(bad[0]["shapes"]) == len(first)
    best = result["best"]["4096x4096x4096"]
    assert best["ratio"] == max(r["ratio"] for r in timed)
    assert max(result["knob_best_fraction"].values()) == 1.0
    assert result["geomean_ratio"] == pytest.approx(best["ratio"])
    assert not result["all_ok"] and json.loads(json.dumps(result)) == result


def test_the_dry_runs_print_their_plans(capsys):
    assert mma.main(["--dry-run", "--n-random", "5"]) == 0
    assert capsys.readouterr().out.strip().endswith("timing jobs on NVIDIA H200")
    assert wgmma.main(["--dry-run", "--skip-perf"]) == 0
    assert capsys.readouterr().out.strip().endswith("0 timed jobs on NVIDIA H200")


@pytest.mark.parametrize("m", [64, 128, 129])
def test_the_memory_bound_probe_reads_each_weight_tile_once_and_tries_multicast(m):
    probe = _load("decode_probe")
    family = get_family("wgmma_sm90")
    problem = GemmProblem(m, 4096, 4096)
    configs = probe.membound_wgmma(problem)
    assert configs and all(family.check(c, problem, H200) is None for c in configs)
    plain = [c for c in configs if not c["SWAP_AB"]]
    swapped = [c for c in configs if c["SWAP_AB"]]
    assert all(c["BM"] >= m for c in plain) and all(c["BN"] >= m for c in swapped)  # one M tile
    assert any(c["CLUSTER_N"] == 2 for c in plain) and any(c["CLUSTER_M"] == 2 for c in swapped)
    assert {c["BN"] for c in plain} >= {64, 128}  # narrow to wide weight tiles


def test_the_memory_bound_probe_tries_each_stage_depth_asked_for_in_the_deepest_ring_that_fits():
    probe = _load("decode_probe")
    family = get_family("wgmma_sm90")
    problem = GemmProblem(64, 4096, 4096)
    configs = probe.membound_wgmma(problem, depths=(128, 256), clusters=(1,))
    assert configs and all(family.check(c, problem, H200) is None for c in configs)
    assert {c["BK"] for c in configs} == {128, 256}
    assert all(c["CLUSTER_M"] == c["CLUSTER_N"] == 1 for c in configs)
    for c in configs:  # one stage deeper would not fit (or the ring is the 8 deep cap)
        deeper = min((s for s in (8, 6, 5, 4, 3, 2) if s > c["STAGES"]), default=None)
        assert deeper is None or family.check(dict(c, STAGES=deeper), problem, H200) is not None
    # a 64-wide weight tile in 256-deep stages: 64 KB a stage, three of them in 227 KB
    narrow = next(c for c in configs if c["BK"] == 256 and c["BN"] == 64 and not c["SWAP_AB"])
    assert narrow["STAGES"] == 3


def _waves_full(problem: GemmProblem, c: dict) -> float:
    """How full the config's waves of CTAs keep the SMs (1.0: every wave uses all 132)."""
    rows, cols = (problem.N, problem.M) if c["SWAP_AB"] else (problem.M, problem.N)
    ctas = -(-rows // c["BM"]) * -(-cols // c["BN"]) * c["SPLIT_K"]
    return ctas / (-(-ctas // H200.sm_count) * H200.sm_count)


@pytest.mark.parametrize("shape", [(128, 6144, 4096), (256, 4096, 14336), (1024, 4096, 4096)])
def test_the_mid_m_probe_takes_intense_tiles_that_fill_the_sms_tile_by_tile(shape):
    probe = _load("decode_probe")
    family = get_family("wgmma_sm90")
    problem = GemmProblem(*shape)
    configs = probe.midm_wgmma(problem, 24)
    assert len(configs) == 24 and all(family.check(c, problem, H200) is None for c in configs)
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == 24
    for c in configs:
        assert c["BM"] * c["BN"] / (c["BM"] + c["BN"]) >= 64  # 128x128 or wider
        assert not c["SWAP_AB"] or problem.M <= 256
        assert _waves_full(problem, c) >= 0.5
    tiles = [(c["BM"], c["BN"], c["SPLIT_K"], c["SWAP_AB"]) for c in configs]
    assert len(set(tiles[:6])) == 6  # each tile's first kind before any tile's second
    assert _waves_full(problem, configs[0]) >= 0.95  # the first tile keeps the SMs busy


def test_the_l2_reuse_table_compares_every_variant_with_the_64_deep_box_stream_alone():
    micro = _load("stream_micro_h200")
    row = dict(N=4096, K=4096, R=64, MC=1)
    rows = [dict(row, RA=0, us=13.0),  # a row of the first run: no KB, no PACK (64-deep boxes)
            dict(row, RA=64, us=13.65),
            dict(row, RA=0, KB=4, PACK=0, us=11.7),
            dict(row, RA=0, KB=4, PACK=1, us=9.1),
            dict(row, RA=64, KB=4, PACK=1, us=9.75),
            dict(row, RA=0, OCC=2, us=11.05)]  # two CTAs an SM: compared, never the baseline
    table = micro.reuse_slowdown(rows)
    assert table == {"4096x4096/R64/KB1/P0/MC1/OCC1": {"RA0": 1.0, "RA64": 1.05},
                     "4096x4096/R64/KB4/P0/MC1/OCC1": {"RA0": 0.9},
                     "4096x4096/R64/KB4/P1/MC1/OCC1": {"RA0": 0.7, "RA64": 0.75},
                     "4096x4096/R64/KB1/P0/MC1/OCC2": {"RA0": 0.85}}


def test_the_sanitizer_sample_holds_the_asked_knobs_and_says_when_it_cannot_be_filled():
    sanitize = _load("sanitize_h200")
    # the default shapes have K = 40 and 264: one 256-deep stage covers both, nothing splits K
    with pytest.raises(SystemExit, match=r"--sample 2: only 0 wgmma_sm90 config\(s\) in 500 "
                                          r"draws fit \{'BK': 256\} with split-K"):
        sanitize.sample_configs("wgmma_sm90", 2, 0, split_k=True, where={"BK": 256}, max_draws=500)
    saved = list(sanitize.SHAPES)
    sanitize.SHAPES[:] = [(17, 24, 520), (129, 136, 1032)]  # K tails past two and four stages
    try:
        configs = sanitize.sample_configs("wgmma_sm90", 2, 0, split_k=True, where={"BK": 256})
    finally:
        sanitize.SHAPES[:] = saved
    assert len(configs) == 2 and all(c["BK"] == 256 and c["SPLIT_K"] > 1 for c in configs)


def test_the_pdl_chain_and_its_reference_are_the_same_computation():
    import torch

    pdl = _load("pdl_check_h200")

    class Exact:  # what a correct dispatcher computes: the fp32 product rounded to bf16
        def gemm(self, a, b):
            return torch.nn.functional.linear(a.float(), b.float()).to(torch.bfloat16)

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(16 if i % 2 == 0 else 8, 8 if i % 2 == 0 else 16, generator=gen)
               .to(torch.bfloat16) for i in range(4)]
    x = torch.randn(3, 8, generator=gen).to(torch.bfloat16)
    out = pdl.chain(Exact(), x, weights)
    assert out.shape == (3, 8) and torch.equal(out, pdl.reference(x, weights))
    assert pdl.rel_err(out, out) == 0.0
    assert not torch.equal(out, pdl.chain(Exact(), x, weights[:2]))  # every link counts


def test_the_pdl_graph_check_tells_a_programmatic_graph_that_parts_from_the_plain_one():
    import torch

    pdl = _load("pdl_check_h200")

    class Replayed:  # a captured graph: each replay writes its values into its output tensor
        def __init__(self, values, out):
            self.values, self.out, self.n = values, out, 0

        def replay(self):
            self.out.copy_(self.values[min(self.n, len(self.values) - 1)])
            self.n += 1

    plain = torch.arange(6.0).reshape(2, 3).to(torch.bfloat16)
    wrong = plain.clone()
    wrong[1, 2] += 4  # one element off, from the second replay on
    serial_out, pdl_out = torch.empty_like(plain), torch.empty_like(plain)
    graphs = {"serial": (Replayed([plain], serial_out), serial_out),
              "programmatic": (Replayed([plain, wrong], pdl_out), pdl_out)}
    got = pdl.graph_check(graphs, plain, plain, plain, 3)
    assert (got["bitwise_graph"], got["graph_equals_eager"], got["serial_replays_agree"]) == \
        (False, True, True)
    assert (got["programmatic_replays_agree"], got["programmatic_graph_equals_eager"],
            got["differing_elements"], got["elements"]) == (False, 1, 1, 6)
    assert got["programmatic_graph_rel_err_vs_fp32_chain"] > 0
    agree = {"serial": (Replayed([plain], serial_out), serial_out),
             "programmatic": (Replayed([plain], pdl_out), pdl_out)}
    assert pdl.graph_check(agree, plain, plain, plain, 3)["bitwise_graph"] is True
    assert pdl.graph_input(plain, "gemm") is plain and pdl.graph_input(plain, "copy") is not plain


def test_the_decode_probe_plans_every_family_on_every_decode_shape(monkeypatch, capsys):
    probe = _load("decode_probe")
    monkeypatch.setattr(sys, "argv", ["decode_probe", "--families", "stream_sm90,skinny_sm90",
                                      "--m", "64", "--per-shape", "8", "--edge-configs", "1",
                                      "--plan-only"])
    probe.main()
    counts = capsys.readouterr().out.split(": ", 1)[1]
    # four Llama layers at M = 64, eight configs each (its valid seeds first), for each family
    # (stream_sm90's MTILES 8 serves M = 64)
    assert "('stream_sm90', 'decode'): 32" in counts and "('skinny_sm90', 'decode'): 32" in counts


def test_the_memory_bound_probe_can_hold_more_weight_rows_under_swap_ab():
    """--membound-swap-all-bm: swap-AB at each BM of its schedule (256 weight rows a CTA halve
    the activation tile's L2 re-reads against 128), not the smallest only."""
    probe = _load("decode_probe")
    family = get_family("wgmma_sm90")
    problem = GemmProblem(129, 4096, 4096)
    few = probe.membound_wgmma(problem, depths=(64, 128), clusters=(1,))
    every = probe.membound_wgmma(problem, depths=(64, 128), clusters=(1,), swap_all_bm=True)
    assert all(family.check(c, problem, H200) is None for c in every)
    assert [c for c in few if c in every] == few  # the smallest BMs are kept
    bms = lambda cs, sched: {c["BM"] for c in cs if c["SWAP_AB"] and c["SCHEDULE"] == sched}  # noqa: E731
    assert bms(few, "cooperative") == {128} and bms(every, "cooperative") == {128, 256}
    assert all(c["BN"] == 136 for c in every if c["SWAP_AB"])  # 129 tokens: one 136-wide tile


def test_the_method_comparison_pairs_configs_and_reads_the_rate_gain():
    ab = _load("method_ab_h200")
    old = {"ratios": {"p a": 1.0, "p b": 0.5, "q c": 2.0}, "trials_per_s": 2.0}
    new = {"ratios": {"p a": 1.1, "p b": 0.5, "q d": 1.0}, "trials_per_s": 5.0}
    got = ab.compare(old, new)
    assert got["paired_configs"] == 2 and got["rate_gain"] == 2.5
    assert got["median_log_ratio_diff"] == pytest.approx(math.log(1.1) / 2)
    assert ab.compare({**old, "trials_per_s": None}, new)["rate_gain"] is None


def test_a_result_is_filed_under_the_gpu_it_ran_on(monkeypatch, tmp_path):
    """A device call that asked for an H200 may get an H100: out_path names the file after the
    card the script ran on; an H200 run, a CPU run and an explicit path keep the name."""
    results = _load("gpu_result")
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(results, "card_tag", lambda: "h100")
    assert results.out_path("stream_wn_probe_h200.json") == tmp_path / "stream_wn_probe_h100.json"
    assert results.out_path("x_h200.json", tmp_path / "given.json") == tmp_path / "given.json"
    for tag in ("h200", None):
        monkeypatch.setattr(results, "card_tag", lambda tag=tag: tag)
        assert results.out_path("gated_h200.json") == tmp_path / "gated_h200.json"
