"""skinny_sm90 (the decode family) on the CPU: its rules, launch geometry, seeds, and real sm_90a
compiles (no spills, HMMA present, every knob reaching the cubin or the launch)."""
from __future__ import annotations


from family_checks import assert_every_knob_reaches_the_cubin_or_the_launch, pool, valid_sample  # noqa: F401
from tunefw.cuda.compiler import sass_check
from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import get_family

SKINNY = get_family("skinny_sm90")
BASE = {"BN": 32, "MTILES": 2, "KV": 2, "PF": 2, "WARPS": 4, "CK": 2, "L2PF": 0, "OCC": 1}
DECODE = [GemmProblem(m, n, k) for m in (1, 2, 4, 8, 16)
          for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))]

SHAPES = [GemmProblem(1, 4096, 4096), GemmProblem(16, 4096, 14336), GemmProblem(64, 6144, 4096)]


def check(config: dict, m: int, n: int = 4096, k: int = 4096) -> str | None:
    return SKINNY.check({**BASE, **config}, GemmProblem(m, n, k), H200)


def test_mtiles_must_hold_m_and_no_more_than_twice_what_it_needs():
    assert check({"MTILES": 2}, 16) is None
    assert "holds M <= 16 rows" in check({"MTILES": 2}, 17)
    assert check({"MTILES": 2}, 1) is None  # an M=16 config serves every smaller M
    assert "more than twice" in check({"MTILES": 3}, 1)
    small = {"MTILES": 8, "KV": 1, "PF": 1, "BN": 16}
    assert check(small, 64) is None and check(small, 33) is None


def test_work_rules_name_the_knob_and_the_shape():
    assert "past N=8" in check({"BN": 32}, 1, n=8)
    assert check({"BN": 16, "CK": 1, "WARPS": 1, "KV": 1}, 1, n=8, k=8) is None
    # K=4096, KV=2: 64 k-steps; 16 ranks of 4 steps leave 4 warps each one step
    assert check({"CK": 16, "WARPS": 4}, 1) is None
    assert "WARPS=8 > the 4 k-steps" in check({"CK": 16, "WARPS": 8}, 1)
    # K=40, KV=1: 2 k-steps over a cluster of 4 ranks: the last ones get none
    assert "without work" in check({"CK": 4, "WARPS": 1, "KV": 1}, 1, k=40)


def test_occupancy_and_registers_are_checked_together():
    heavy = {"BN": 32, "MTILES": 2, "KV": 2, "PF": 2, "WARPS": 8}  # an estimated 164 registers
    assert check({**heavy, "OCC": 1}, 16) is None
    assert "the 128 that OCC=2 CTAs of 256 threads allow" in check({**heavy, "OCC": 2}, 16)
    # ptxas spilled this one at 255 registers when the estimate ignored the row pointers
    assert "it would spill" in check({"BN": 64, "MTILES": 4, "KV": 1, "PF": 2, "CK": 4, "OCC": 2}, 32)
    assert "it would spill" in check({"WARPS": 16, "OCC": 4}, 16)


def test_launch_geometry_follows_the_config():
    p = GemmProblem(16, 4104, 4096)
    launch = SKINNY.launch({**BASE, "BN": 32, "CK": 4}, p, H200)
    assert launch.grid == (129 * 4, 1, 1) and launch.cluster == (4, 1, 1)
    assert launch.block == (4 * 32, 1, 1) and launch.workspace_bytes == 0
    assert launch.smem_bytes == 4 * 2 * 8 * (32 + 4) * 4
    args = SKINNY.kernel_args(BASE, p, {"a": 1, "b": 2, "c": 3, "bias": 4})
    assert [v for v, _ in args] == [1, 2, 3, 4, 16, 4104, 4096]
    assert [v for v, _ in SKINNY.kernel_args(BASE, p, {"a": 1, "b": 2, "c": 3})][3] == 0


def test_every_decode_shape_gets_valid_seeds():
    for p in DECODE:
        seeds = [c for c in SKINNY.seed_configs() if SKINNY.check(c, p, H200) is None]
        assert len(seeds) >= 2, p


def test_name_expression_orders_the_template_arguments_as_the_kernel():
    assert SKINNY.name_expression(BASE, "fp16") == "gemm_skinny_sm90<1, 32, 2, 2, 2, 4, 2, 0, 1>"


def test_valid_configs_compile_without_spills_and_use_tensor_cores(pool):
    configs = valid_sample(SKINNY, 10, 5, SHAPES) + [
        {**BASE, "CK": 16, "WARPS": 4, "MTILES": 1},  # the largest cluster's DSMEM epilogue
        {**BASE, "WARPS": 16, "MTILES": 1, "KV": 1, "PF": 1, "OCC": 2},
    ]
    results = [pool.submit(SKINNY, c, "bf16", "sm_90a") for c in configs]
    for config, future in zip(configs, results):
        r = future.result()
        assert r.ok, (config, r.log[:500])
        assert r.spill_bytes == 0 and sass_check(r.cubin, require_op="HMMA") is None, config


def test_every_knob_changes_the_cubin_or_the_launch(pool):
    problem = GemmProblem(16, 4096, 4096)
    base = {**BASE, "OCC": 2}
    assert_every_knob_reaches_the_cubin_or_the_launch(SKINNY, base, problem, pool)
