"""CPU tests of the wgmma_sm90 family: the space, check(), launch geometry, tensor-map specs,
and NVRTC compiles for sm_90a (no spills, HGMMA in the SASS, no local memory).

Results need an H200: benchmarks/wgmma_sm90_gpu_check.py. Compiles go through
tunefw.cuda.compiler.CompilePool (2 workers, a per-session cache) and are sampled to stay near a minute.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import replace

import pytest
from cubin import kernel_text, sass_instructions
from space import sample_space

from tunefw.cuda.compiler import CompilePool, sass_check, sass_opcodes
from tunefw.device import A100, H200
from tunefw.problem import GemmProblem
from tunefw.templates.base import TEMPLATE_DIR
from tunefw.templates.wgmma_sm90 import (MAX_ACCUMULATORS, MAX_ACCUMULATORS_SPLIT_K,
                                         REGS_AT_LAUNCH, WgmmaSm90)
from tunefw.tune.space import random_valid

T = WgmmaSm90()
BIG = GemmProblem(4096, 4096, 4096)
LARGE = [BIG, GemmProblem(8192, 8192, 8192), GemmProblem(8192, 28672, 4096),
         GemmProblem(2048, 4096, 14336)]


# ---- compiling (one pool for the module) -----------------------------------------------------
@pytest.fixture(scope="module")
def pool():
    with CompilePool(2, timeout_s=300) as p:  # into the session's cubin cache (conftest)
        yield p


def compile_all(pool, configs, dtype="bf16"):
    futures = [pool.submit(T, c, dtype, "sm_90a") for c in configs]
    return [f.result() for f in futures]


# ---- configs near the default ------------------------------------------------------------------
def _repair(config: dict, moved: str, problem: GemmProblem) -> dict | None:
    """The nearest valid config after a one-knob move: adjust dependent knobs (schedule-bound
    tile sizes, stage count, swizzle, cluster), never the moved one."""
    if T.check(config, problem, H200) is None:
        return config
    values = {p.name: p.values for p in T.params}
    for name in ("SCHEDULE", "BM", "BN", "STAGES", "SWIZZLE", "CLUSTER_M", "EPILOGUE"):
        if name == moved:
            continue
        for v in values[name]:
            c = dict(config, **{name: v})
            if T.check(c, problem, H200) is None:
                return c
    for bn in values["BN"]:  # two dependents at once (e.g. ping-pong + split-K: BN and STAGES)
        for stages in values["STAGES"]:
            c = dict(config, BN=bn, STAGES=stages)
            if moved not in ("BN", "STAGES") and T.check(c, problem, H200) is None:
                return c
    for cm in values["CLUSTER_M"]:  # narrow widths: no B multicast and direct stores (BN=8)
        for epilogue in values["EPILOGUE"]:
            c = dict(config, CLUSTER_M=cm, EPILOGUE=epilogue)
            if moved not in ("CLUSTER_M", "EPILOGUE") and T.check(c, problem, H200) is None:
                return c
    for bn in values["BN"]:  # deep rings: a shallower stage (BK and its swizzle) and BN
        for bk in values["BK"]:
            c = dict(config, BN=bn, BK=bk, SWIZZLE=min(bk * 2, 128))
            if moved not in ("BN", "BK", "SWIZZLE") and T.check(c, problem, H200) is None:
                return c
    return None


def one_at_a_time(problem: GemmProblem = BIG):
    """(param, value, config) for every non-default value of every parameter, valid for the
    problem (swap-AB, for M <= 256, on a decode shape of the same N and K)."""
    default = T.default_config()
    out = []
    for p in T.params:
        where = GemmProblem(128, problem.N, problem.K) if p.name == "SWAP_AB" else problem
        for v in p.values[1:]:
            fixed = _repair(dict(default, **{p.name: v}), p.name, where)
            if fixed is not None:
                out.append((p.name, v, fixed))
    return out


# ---- the space --------------------------------------------------------------------------------
def test_default_config_is_sound_for_big_shapes():
    c = T.default_config()
    assert c == dict(BM=128, BN=256, BK=64, STAGES=4, SWIZZLE=128, CLUSTER_M=2, CLUSTER_N=1,
                     SCHEDULE="cooperative", PERSISTENT=1, RASTER="m", GROUP=8, SPLIT_K=1,
                     EPILOGUE="tma", SWAP_AB=0)
    for problem in LARGE:
        assert T.check(c, problem, H200) is None
    assert T.accumulators_per_thread(c) == 128


def test_template_args_follow_the_kernel_signature():
    text = (TEMPLATE_DIR / T.source).read_text()
    decl = re.search(r"template\s*<([^>]*)>\s*__global__", text).group(1)
    names = [re.sub(r"/\*.*?\*/", "", part).split("=")[0].split()[-1] for part in decl.split(",")]
    assert names == ["DTYPE"] + list(T.param_names) + ["GATED"]  # the problem's gate, last
    assert (T.name_expression(T.default_config(), "bf16")
            == "gemm_wgmma_sm90<0, 128, 256, 64, 4, 128, 2, 1, 0, 1, 0, 8, 1, 1, 0>")
    assert T.template_args(T.default_config(), "fp16")[0] == "1"
    sig = re.search(r"gemm_wgmma_sm90\(([^)]*)\)", text).group(1)
    assert [a.split()[-1].lstrip("*") for a in sig.split(",")] == \
        ["tmap_a", "tmap_b", "tmap_c", "C", "workspace", "M", "N", "K"]


def test_every_param_value_is_reachable():
    seen = {(p, v) for p, v, _ in one_at_a_time()}
    for p in T.params:
        for v in p.values[1:]:
            assert (p.name, v) in seen, f"{p.name}={v} never valid near the default"


REJECTS = [
    # (changes, problem, device, the field the reason must name)
    (dict(BK=32, SWIZZLE=128), BIG, H200, "SWIZZLE"),
    (dict(BM=64), BIG, H200, "BM"),                                      # cooperative 64 rows
    (dict(BM=256, SCHEDULE="pingpong", CLUSTER_M=1), BIG, H200, "BM"),
    (dict(SCHEDULE="pingpong"), BIG, H200, "BN"),                        # 256 accumulators
    (dict(BM=256, BN=256), BIG, H200, "BN"),
    (dict(SCHEDULE="pingpong", BN=192, SPLIT_K=2), BIG, H200, "SPLIT_K"),  # 192 acc + split-K
    (dict(STAGES=5), BIG, H200, "STAGES"),                               # ring + staging > 227 KB
    (dict(STAGES=7, BN=192, EPILOGUE="direct"), BIG, H200, "STAGES"),
    (dict(STAGES=4), BIG, replace(H200, smem_per_block_optin=200_000), "STAGES"),
    (dict(CLUSTER_M=2), GemmProblem(100, 4096, 4096), H200, "CLUSTER_M"),
    (dict(CLUSTER_M=1, CLUSTER_N=2), GemmProblem(4096, 256, 4096), H200, "CLUSTER_N"),
    (dict(SPLIT_K=8), GemmProblem(256, 4096, 256), H200, "SPLIT_K"),
    (dict(BN=100), BIG, H200, "BN"),
    (dict(EPILOGUE="tma_overlap", SCHEDULE="pingpong", BN=128), BIG, H200, "EPILOGUE"),
    (dict(EPILOGUE="tma_overlap", SPLIT_K=2), BIG, H200, "EPILOGUE"),
    (dict(EPILOGUE="tma_overlap", BN=192, BM=256, STAGES=3), BIG, H200, "EPILOGUE"),  # 192 + 96
    (dict(BK=128, STAGES=3), BIG, H200, "STAGES"),                         # 96 KB stages
    (dict(), BIG, A100, "compute capability"),
    (dict(), BIG, replace(H200, arch_suffix=""), "compute capability"),
]


@pytest.mark.parametrize("changes,problem,device,field", REJECTS)
def test_check_rejects_with_a_reason_naming_the_field(changes, problem, device, field):
    config = dict(T.default_config(), **changes)
    reason = T.check(config, problem, device)
    assert reason is not None, f"{changes} should be rejected on {problem.key()}"
    assert field in reason and "\n" not in reason, reason


def test_check_accepts_edge_shapes_with_small_configs():
    small = dict(T.default_config(), CLUSTER_M=1)
    for shape in ((1, 8, 8), (17, 24, 40), (129, 136, 264), (4095, 4104, 4104), (128, 6144, 4096)):
        assert T.check(small, GemmProblem(*shape), H200) is None, shape


def test_the_space_is_mostly_reachable():
    import random
    configs = sample_space(T, random.Random(0), 20000)
    plain = [c for c in configs if not c["SWAP_AB"]]
    swapped = [c for c in configs if c["SWAP_AB"]]
    # Samplers draw from the whole space: at least 1 in 20 points without swap-AB must be
    # runnable at 4096^3 (BK=128 and 256 stages fit few tiles and 2-3 deep rings; the BN widths
    # off a multiple of 32, three in four of BN's values, store directly only), 1 in 25 with it
    # (direct stores only) at M=128, the shapes it is for. A refused point costs a check() on
    # the CPU and no budget, so this guards against a space mostly made of refusals.
    assert sum(T.check(c, BIG, H200) is None for c in plain) > len(plain) / 20
    decode = GemmProblem(128, 4096, 4096)
    assert sum(T.check(c, decode, H200) is None for c in swapped) > len(swapped) / 25


# ---- launch geometry, workspace, tensor maps, arguments ---------------------------------------
def test_launch_geometry():
    c = T.default_config()
    prob = GemmProblem(4095, 4104, 4104)
    num_m, num_n = 32, 17
    launch = T.launch(c, prob, H200)
    assert launch.block == (384, 1, 1) and launch.cluster == (2, 1, 1)
    work = 16 * 17  # cluster tiles: ceil(32 / 2) x 17
    assert T.total_work(c, prob) == work
    assert launch.grid == (2 * 66, 1, 1)  # persistent: 132 SMs / 2-CTA clusters
    assert launch.smem_bytes == T.estimate(c).smem_bytes <= H200.smem_per_block_optin
    assert launch.workspace_bytes == 0
    flat = T.launch(dict(c, PERSISTENT=0), prob, H200)
    assert flat.grid == (2 * work, 1, 1)
    wide = T.launch(dict(c, CLUSTER_M=1, CLUSTER_N=2), prob, H200)
    assert wide.cluster == (1, 2, 1) and wide.grid == (66, 2, 1)
    small = T.launch(dict(c, CLUSTER_M=1), GemmProblem(17, 24, 40), H200)
    assert small.grid == (1, 1, 1)
    split = dict(c, SPLIT_K=4)
    ls = T.launch(split, prob, H200)
    assert T.total_work(split, prob) == 4 * work
    tiles = num_m * num_n
    assert ls.workspace_bytes == 4 * (-(-tiles // 64) * 64 + tiles * 4 * 128 * 256)


def test_pingpong_launch_geometry():
    """Non-persistent ping-pong: two work items per cluster (one per consumer warpgroup)."""
    c = dict(T.default_config(), SCHEDULE="pingpong", BN=128, CLUSTER_M=1, PERSISTENT=0)
    prob = GemmProblem(4095, 4104, 4104)
    work = T.total_work(c, prob)
    assert work == 32 * 33
    assert T.launch(c, prob, H200).grid == (-(-work // 2), 1, 1)
    odd = GemmProblem(300, 1000, 520)  # 3 x 8 = 24 tiles; 2x1 clusters: 2 x 8 cluster tiles
    c2 = dict(c, CLUSTER_M=2)
    assert T.launch(c2, odd, H200).grid == (2 * 8, 1, 1)
    assert T.launch(dict(c2, SPLIT_K=2), odd, H200).grid == (2 * 16, 1, 1)  # 32 items, 2 each
    persistent = T.launch(dict(c, PERSISTENT=1), prob, H200)
    assert persistent.grid == (132, 1, 1)


def test_tensor_map_specs():
    c = T.default_config()
    specs = T.tensor_map_specs(c, GemmProblem(4095, 4104, 4096))
    assert specs["a"] == {"dims": (4096, 4095), "strides": (8192,), "box": (64, 128), "swizzle": 128,
                          "operand": "a"}
    assert specs["b"] == {"dims": (4096, 4104), "strides": (8192,), "box": (64, 128), "swizzle": 128,
                          "operand": "b"}
    assert specs["c"] == {"dims": (4104, 4095), "strides": (8208,), "box": (64, 64), "swizzle": 128,
                          "operand": "c"}
    # swap-AB: the kernel's row operand is B (N rows), its column operand A (the M tokens)
    swap = dict(c, SWAP_AB=1, EPILOGUE="direct", CLUSTER_M=1, BN=160, SPLIT_K=4)
    odd = GemmProblem(129, 4096, 4096)
    sw = T.tensor_map_specs(swap, odd)
    assert (sw["a"]["operand"], sw["a"]["dims"], sw["a"]["box"]) == ("b", (4096, 4096), (64, 128))
    assert (sw["b"]["operand"], sw["b"]["dims"], sw["b"]["box"]) == ("a", (4096, 129), (64, 160))
    assert sw["c"]["dims"] == (4096, 129) and T.check(swap, odd, H200) is None
    assert T.tile_counts(swap, odd) == (32, 1) and T.launch(swap, odd, H200).grid == (128, 1, 1)
    s2 = T.tensor_map_specs(dict(c, CLUSTER_M=1, CLUSTER_N=2, SWIZZLE=32, BN=96), BIG)
    assert s2["a"]["box"] == (16, 64) and s2["b"]["box"] == (16, 96)
    assert s2["c"]["box"] == (32, 64) and s2["c"]["swizzle"] == 64
    for spec in (*specs.values(), *s2.values()):
        assert all(b <= 256 for b in spec["box"]) and spec["box"][0] * 2 <= spec["swizzle"]


def test_kernel_args_without_a_gpu(monkeypatch):
    calls = []

    def fake_encode(spec, dtype, address):
        calls.append((dict(spec), dtype, address))
        return f"tmap@{address}"

    monkeypatch.setattr(WgmmaSm90, "encode_tensor_map", staticmethod(fake_encode))
    prob = GemmProblem(17, 24, 40, "fp16")
    args = T.kernel_args(T.default_config(), prob, {"a": 16, "b": 32, "c": 48, "workspace": 64})
    assert [v for v, _ in args] == ["tmap@16", "tmap@32", "tmap@48", 48, 64, 17, 24, 40]
    assert [t for _, t in args] == [None] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 3
    assert [x[1] for x in calls] == ["fp16"] * 3


def test_a_tensor_map_is_encoded_once_per_spec_and_address(monkeypatch):
    from tunefw.templates import wgmma_sm90

    raw = []
    monkeypatch.setattr(wgmma_sm90, "_MAPS", {})
    monkeypatch.setattr(wgmma_sm90, "MAPS_KEPT", 3)
    monkeypatch.setattr(wgmma_sm90, "encode_tensor_map_raw",
                        lambda spec, dtype, address: raw.append(address) or object())
    specs = T.tensor_map_specs(T.default_config(), GemmProblem(256, 512, 1024))
    first = WgmmaSm90.encode_tensor_map(specs["a"], "bf16", 4096)
    assert WgmmaSm90.encode_tensor_map(specs["a"], "bf16", 4096) is first and raw == [4096]
    assert WgmmaSm90.encode_tensor_map(specs["a"], "fp16", 4096) is not first  # another dtype
    assert WgmmaSm90.encode_tensor_map(specs["b"], "bf16", 4096) is not first  # another layout
    assert raw == [4096] * 3
    WgmmaSm90.encode_tensor_map(specs["a"], "bf16", 8192)  # a fourth map: the memo starts over
    assert len(wgmma_sm90._MAPS) == 1 and raw == [4096] * 3 + [8192]
    WgmmaSm90.encode_tensor_map(specs["a"], "bf16", 4096)
    assert raw[-1] == 4096 and len(raw) == 5


def test_the_module_works_without_cuda_bindings():
    """Importing the family, checking and describing configs never import cuda.bindings (only
    encoding a tensor map does): run where cuda.bindings cannot be imported at all."""
    import subprocess
    import sys
    code = ("import sys\n"
            "sys.modules['cuda.bindings'] = sys.modules['cuda.bindings.driver'] = None\n"
            "from tunefw.device import H200\n"
            "from tunefw.problem import GemmProblem\n"
            "from tunefw.templates.wgmma_sm90 import WgmmaSm90\n"
            "t = WgmmaSm90(); c = t.default_config(); p = GemmProblem(4096, 4096, 4096)\n"
            "assert t.check(c, p, H200) is None\n"
            "print(t.tensor_map_specs(c, p)['a']['box'])\n"
            "try:\n"
            "    t.encode_tensor_map(t.tensor_map_specs(c, p)['a'], 'bf16', 0)\n"
            "except ImportError:\n"
            "    print('encode needs cuda.bindings')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["(64, 128)", "encode needs cuda.bindings"]


# ---- compiles ------------------------------------------------------------------------------------
def test_one_at_a_time_compiles_clean(pool):
    """Default and every one-knob move compile for sm_90a: no spills, HGMMA, no LDL/STL."""
    configs = [T.default_config()] + [c for _, _, c in one_at_a_time()]
    results = compile_all(pool, configs)
    for c, r in zip(configs, results):
        assert r.ok, (c, r.log[-2000:])
        assert r.spill_bytes == 0, (c, r.log[-1000:])
        assert r.regs == REGS_AT_LAUNCH and r.smem == 0, (c, r.regs, r.smem)
    sample = [results[0], results[len(results) // 2], results[-1]]
    for r in sample:
        assert sass_check(r.cubin, require_hgmma=True) is None
        ops = sass_opcodes(r.cubin)
        assert any(op.startswith("USETMAXREG") for op in ops), "setmaxnreg ignored"
        assert any(op.startswith("UTMALDG") for op in ops), "no TMA loads"
        assert any(op.startswith("SYNCS") for op in ops), "no mbarrier waits"


def test_fp16_and_bf16_compile_to_their_own_hgmma(pool):
    """The dtype reaches the tensor-core instruction: fp16 is HGMMA.64x256x16.F32 and bf16 the
    same shape with .BF16 (the default config: 64-row warpgroup slices of a 128x256 tile)."""
    (fp16,) = compile_all(pool, [T.default_config()], dtype="fp16")
    (bf16,) = compile_all(pool, [T.default_config()], dtype="bf16")
    for r in (fp16, bf16):
        assert r.ok and r.spill_bytes == 0, r.log[-2000:]
        assert sass_check(r.cubin, require_hgmma=True) is None
    assert {op for op in sass_instructions(fp16.cubin) if "GMMA" in op} == {"HGMMA.64x256x16.F32"}
    assert {op for op in sass_instructions(bf16.cubin) if "GMMA" in op} == {
        "HGMMA.64x256x16.F32.BF16"}


def test_every_knob_changes_code_or_launch(pool):
    """Moving any one knob changes the kernel code or its launch geometry (no knob ignored)."""
    default = T.default_config()
    moves = one_at_a_time()
    firsts = {}
    for name, value, c in moves:  # the first move of each knob is enough
        firsts.setdefault(name, (value, c))
    configs = [default] + [c for _, c in firsts.values()]
    results = compile_all(pool, configs)
    base = kernel_text(results[0].cubin, results[0].lowered_name)
    problem = GemmProblem(4095, 4104, 4104)
    base_launch = T.launch(default, problem, H200)
    for (name, (value, c)), r in zip(firsts.items(), results[1:]):
        code = kernel_text(r.cubin, r.lowered_name)
        launch = T.launch(c, problem, H200)
        assert code != base or launch != base_launch, f"{name}={value} changed nothing"
    assert set(firsts) == set(T.param_names)


def test_accumulator_limit_matches_ptxas(pool):
    """check()'s register rule is where ptxas starts spilling (under setmaxnreg 232)."""
    base = dict(T.default_config(), CLUSTER_M=1)
    fits = [dict(base, SCHEDULE="pingpong", BN=192),                           # 192 acc
            dict(base, BM=256, BN=192, STAGES=3, EPILOGUE="direct"),            # 192 acc (2 x 96)
            dict(base, SCHEDULE="pingpong", BN=128, SPLIT_K=4)]                 # 128 acc, split-K
    spills = [dict(base, SCHEDULE="pingpong", BN=224, STAGES=3),               # 224 acc
              dict(base, SCHEDULE="pingpong", BN=256, STAGES=3),               # 256 acc
              dict(base, SCHEDULE="pingpong", BN=192, SPLIT_K=4)]              # 192 acc, split-K
    assert max(T.accumulators_per_thread(c) for c in fits) == MAX_ACCUMULATORS
    results = compile_all(pool, fits + spills)
    for c, r in zip(fits, results[:len(fits)]):
        assert T.check(c, BIG, H200) is None, c
        assert r.ok and r.spill_bytes == 0, (c, r.spill_bytes)
    for c, r in zip(spills, results[len(fits):]):
        assert T.check(c, BIG, H200) is not None, c
        assert r.ok and r.spill_bytes > 0, (c, "compiles clean: the limit could be raised")
    assert MAX_ACCUMULATORS_SPLIT_K == 128


def test_estimates_agree_with_the_compiler(pool):
    """Sampled valid configs: registers = the launch-bound cap, no static smem, no spills, and the
    dynamic shared memory estimate covers the kernel's carve-up (ring + staging + barriers)."""
    import itertools
    import random
    # ~3 s a build
    picked = list(itertools.islice(random_valid(T, random.Random(7), BIG, H200), 5))
    results = compile_all(pool, picked)
    for c, r in zip(picked, results):
        assert r.ok, (c, r.log[-2000:])
        est = T.estimate(c)
        assert (r.regs, r.smem, r.spill_bytes) == (est.regs_per_thread, 0, 0), (c, r.regs, r.spill_bytes)
        assert est.threads == 384
        parts = T.smem_parts(c)
        ring = c["STAGES"] * (c["BM"] + c["BN"]) * c["BK"] * 2
        assert parts["ring"] == ring and est.smem_bytes == sum(parts.values())
        assert est.smem_bytes <= H200.smem_per_block_optin


def test_no_wgmma_serialization(pool):
    """ptxas must not serialize the wgmmas (C7510-C7520 'Potential Performance Loss'): the main
    loop keeps one group in flight, and the overlapped epilogue (stores during the next tile's
    first group) is branch-free for that reason."""
    base = T.default_config()
    configs = [base, dict(base, EPILOGUE="tma_overlap"), dict(base, EPILOGUE="direct"),
               dict(base, CLUSTER_M=1, CLUSTER_N=2, EPILOGUE="tma_overlap", BM=256, BN=128),
               dict(base, SCHEDULE="pingpong", BN=128, STAGES=6),
               dict(base, SCHEDULE="pingpong", BM=64, BN=128, SPLIT_K=4, CLUSTER_M=1, STAGES=7),
               dict(base, BN=128, SPLIT_K=4)]
    for c in configs:
        assert T.check(c, BIG, H200) is None, c
    for c, r in zip(configs, compile_all(pool, configs)):
        assert r.ok and r.spill_bytes == 0, (c, r.spill_bytes)
        warnings = [line for line in r.log.splitlines() if "(C75" in line]
        assert not warnings, (c, warnings)


def test_swap_ab_seeds_compile_clean_for_odd_m(pool):
    """The swap-AB seeds are valid at M=129 and compile without spills or serialized wgmmas, the
    tokens on wgmma's N side (HGMMA.64xBN) and the transposed direct stores in the SASS."""
    odd = GemmProblem(129, 4096, 4096)
    seeds = [c for c in T.seed_configs() if c["SWAP_AB"]]
    assert len(seeds) == 5 and all(T.check(c, odd, H200) is None for c in seeds)
    for c, r in zip(seeds, compile_all(pool, seeds)):
        assert r.ok and r.spill_bytes == 0, (c, r.spill_bytes)
        assert not [line for line in r.log.splitlines() if "(C75" in line], c
        assert {op for op in sass_instructions(r.cubin) if "GMMA" in op} == {
            f"HGMMA.64x{c['BN']}x16.F32.BF16"}
        assert any(op.startswith("STG.E.U16") for op in sass_instructions(r.cubin)), c


def test_widths_off_a_multiple_of_32_compile_to_their_own_wgmma(pool):
    """BN = 136 under swap-AB (M = 129: one 95%-full tile) and BN = 8..48 either way compile
    clean to HGMMA.64xBN with direct stores; a TMA-store epilogue is refused for them."""
    base = {**T.default_config(), "EPILOGUE": "direct", "CLUSTER_M": 1, "STAGES": 6}
    cases = [({**base, "SWAP_AB": 1, "BN": 136, "SPLIT_K": 4}, GemmProblem(129, 4096, 4096)),
             ({**base, "SWAP_AB": 1, "BN": 144, "SPLIT_K": 4}, GemmProblem(140, 4096, 4096)),
             ({**base, "SWAP_AB": 1, "BN": 16, "SPLIT_K": 4}, GemmProblem(16, 4096, 4096)),
             ({**base, "BN": 24, "SPLIT_K": 2}, GemmProblem(4096, 24, 4096)),
             ({**base, "BN": 8}, GemmProblem(512, 8, 4096)),
             ({**base, "BN": 48, "SCHEDULE": "pingpong", "BM": 64}, GemmProblem(64, 4096, 4096))]
    for c, problem in cases:
        assert T.check(c, problem, H200) is None, (c, T.check(c, problem, H200))
        assert "EPILOGUE" in T.check({**c, "EPILOGUE": "tma"}, problem, H200)
    for (c, _), r in zip(cases, compile_all(pool, [c for c, _ in cases])):
        assert r.ok and r.spill_bytes == 0, (c, r.log[-1500:])
        assert {op for op in sass_instructions(r.cubin) if "GMMA" in op} == {
            f"HGMMA.64x{c['BN']}x16.F32.BF16"}, c
        assert sass_check(r.cubin, require_hgmma=True) is None


@pytest.mark.parametrize("shape", [(129, 4096, 4096), (17, 4104, 4104), (1, 4096, 14336),
                                   (4096, 24, 4096), (200, 136, 264), (4096, 4096, 4096)])
def test_every_valid_config_of_every_width_encodes_legal_tensor_maps(shape):
    """What check() lets through must be launchable: each BN width's valid configs (a seeded
    draw) have TMA boxes of 8..256 rows in whole 8-row swizzle atoms, one swizzle span wide, a
    ring and staging inside the opt-in shared memory, and a multicast slice per cluster CTA."""
    import itertools
    import random
    problem = GemmProblem(*shape)
    widths = next(p.values for p in T.params if p.name == "BN")
    drawn = list(itertools.islice(random_valid(T, random.Random(sum(shape)), problem, H200), 3000))
    seen = set()
    for c in drawn:
        seen.add(c["BN"])
        specs = T.tensor_map_specs(c, problem)
        for x, rows in (("a", c["BM"] // c["CLUSTER_N"]), ("b", c["BN"] // c["CLUSTER_M"])):
            inner, box_rows = specs[x]["box"]
            assert box_rows == rows and 8 <= rows <= 256 and rows % 8 == 0, (x, c)
            assert inner * 2 == specs[x]["swizzle"] == c["SWIZZLE"], (x, c)
        assert T.smem_bytes(c) <= H200.smem_per_block_optin, c
        if c["BN"] % 32:
            assert c["EPILOGUE"] == "direct", c
        launch = T.launch(c, problem, H200)
        assert launch.grid[0] % c["CLUSTER_M"] == 0 and launch.cluster[:2] == (c["CLUSTER_M"],
                                                                               c["CLUSTER_N"])
    assert len(seen) >= len(widths) // 2, sorted(seen)  # the draw reached most widths


def test_nvcc_compiles_the_template(tmp_path):
    """The template also builds with nvcc (-gencode compute_90a/sm_90a), fp16 ping-pong 2x2."""
    import shutil
    import subprocess
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc not installed")
    c = dict(T.default_config(), SCHEDULE="pingpong", BN=128, CLUSTER_M=1, CLUSTER_N=2,
              SPLIT_K=2)
    assert T.check(c, BIG, H200) is None
    args = ", ".join(T.template_args(c, "fp16"))
    src = tmp_path / "inst.cu"
    src.write_text(f'#include "{T.source}"\n'
                   f"template __global__ void gemm_wgmma_sm90<{args}>(const __grid_constant__ "
                   "CUtensorMap, const __grid_constant__ CUtensorMap, const __grid_constant__ "
                   "CUtensorMap, unsigned short*, float*, int, int, int);\n")
    proc = subprocess.run([nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-cubin",
                           f"-I{TEMPLATE_DIR}", f"-I{TEMPLATE_DIR / 'include'}", "-Xptxas", "-v",
                           "-o", str(tmp_path / "k.cubin"), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "0 bytes spill stores" in proc.stderr
