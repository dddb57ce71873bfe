"""rows_sm90 (whole-row bulk-copy decode family) on the CPU: its K-dependent rules, the
persistent launch, seeds, and real sm_90a compiles (no spills, HMMA and 1D bulk copies present,
every knob reaching the cubin or the launch)."""
from __future__ import annotations

from family_checks import assert_compiles_clean, pool, valid_sample  # noqa: F401
from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import get_family

ROWS = get_family("rows_sm90")
BASE = {"RS": 8, "STAGES": 2, "WARPS": 16, "KP": 4, "MROWS": 8, "OCC": 1, "COPY": 32768}


def check(config: dict, m: int, n: int = 4096, k: int = 4096) -> str | None:
    return ROWS.check({**BASE, **config}, GemmProblem(m, n, k), H200)


def test_mrows_holds_m_and_sixteen_only_past_eight():
    assert check({}, 8) is None
    assert "holds M <= 8" in check({}, 9)
    assert "MROWS=16 for M=8" in check({"MROWS": 16}, 8)


def test_kp_is_exactly_the_pairs_per_warp():
    # K=4096: 64 pairs of 32-k blocks; 16 warps take 4 each, 8 warps 8
    assert check({"WARPS": 8, "KP": 8}, 1) is None
    assert "are 8 per warp" in check({"WARPS": 8, "KP": 4}, 1)
    assert "are 5 per warp" in check({"KP": 4}, 1, k=4104)  # 65 pairs: the last one partial
    assert "spill" in check({"RS": 4, "WARPS": 8, "KP": 8}, 1)
    assert check({"RS": 4, "STAGES": 6}, 1) is None
    assert "warps without work" in check({"KP": 2, "COPY": 16384, "RS": 16}, 1, k=512)


def test_the_ring_grows_with_k_and_must_fit():
    assert ROWS.smem_bytes(BASE, 4096) == 2 * 8 * 4096 * 2 + 2 * 16 * 1 * 32 * 2 * 1 * 4 + 2 * 16
    four = {**BASE, "RS": 4, "STAGES": 6}  # 4-row stages: one group per step still
    assert ROWS.smem_bytes(four, 4096) == 6 * 4 * 4096 * 2 + 2 * 16 * 1 * 32 * 2 * 1 * 4 + 6 * 16
    assert ROWS.smem_bytes(BASE, 8192) - ROWS.smem_bytes(BASE, 4096) == 2 * 8 * 4096 * 2
    assert check({"STAGES": 3}, 1) is None  # three stages of 8 rows x 8 KB
    assert "shared memory" in check({"RS": 16}, 1)  # two of 16 rows x 8 KB do not fit
    two_per_sm = {"RS": 32, "STAGES": 2, "WARPS": 4, "KP": 4, "OCC": 2}
    assert "OCC=2" in check(two_per_sm, 1, k=1024)  # 135 KB each: one fits, two do not
    assert check({**two_per_sm, "RS": 16, "STAGES": 3}, 1, k=1024) is None


def test_copy_and_rows_rules_name_the_knob_and_the_shape():
    assert "COPY=65536" in check({"COPY": 65536, "WARPS": 8, "KP": 2}, 1, k=1024)
    assert "past N=8" in check({"RS": 16, "WARPS": 8, "KP": 2, "COPY": 16384}, 1, n=8, k=1024)


def test_the_grid_is_persistent_and_never_larger_than_the_groups():
    launch = ROWS.launch(BASE, GemmProblem(1, 4096, 4096), H200)
    assert launch.grid == (132, 1, 1) and launch.block == (17 * 32, 1, 1)
    assert launch.smem_bytes == ROWS.smem_bytes(BASE, 4096) and launch.workspace_bytes == 0
    assert ROWS.launch(BASE, GemmProblem(1, 264, 4096), H200).grid == (33, 1, 1)
    two = {**BASE, "OCC": 2, "WARPS": 4, "KP": 4, "COPY": 16384}
    assert ROWS.launch(two, GemmProblem(1, 28672, 1024), H200).grid == (264, 1, 1)


def test_decode_shapes_up_to_eight_rows_get_valid_seeds():
    for n, k in ((4096, 4096), (6144, 4096), (28672, 4096), (1024, 4096)):
        for m in (1, 2, 4, 8):
            p = GemmProblem(m, n, k)
            assert sum(ROWS.check(c, p, H200) is None for c in ROWS.seed_configs()) >= 2, p


def test_name_expression_orders_the_template_arguments_as_the_kernel():
    assert ROWS.name_expression(BASE, "bf16") == "gemm_rows_sm90<0, 8, 2, 16, 4, 8, 1, 32768>"


def test_valid_configs_compile_without_spills_with_bulk_copies_and_tensor_cores(pool):
    shapes = [GemmProblem(4, 4096, 4096), GemmProblem(12, 1024, 1032), GemmProblem(1, 2048, 2048)]
    configs = valid_sample(ROWS, 8, 4, shapes)
    assert_compiles_clean(ROWS, configs, pool, "UBLKCP")


def test_every_knob_changes_the_cubin_or_the_launch(pool):
    problem = GemmProblem(4, 2048, 1024)  # 16 pairs of 32-k blocks, 16 KB per 8 rows
    base = {"RS": 16, "STAGES": 3, "WARPS": 4, "KP": 4, "MROWS": 8, "OCC": 1, "COPY": 16384}
    # KP follows WARPS and MROWS follows M: those two change with a partner
    changes = {"RS": {"RS": 32}, "STAGES": {"STAGES": 2}, "WARPS": {"WARPS": 8, "KP": 2},
               "OCC": {"OCC": 2}, "COPY": {"COPY": 32768}}
    base_cubin = pool.submit(ROWS, base, "bf16", "sm_90a").result().cubin
    base_launch = ROWS.launch(base, problem, H200)
    for knob, change in changes.items():
        config = {**base, **change}
        assert ROWS.check(config, problem, H200) is None, knob
        cubin = pool.submit(ROWS, config, "bf16", "sm_90a").result().cubin
        assert cubin != base_cubin or ROWS.launch(config, problem, H200) != base_launch, knob
    sixteen = {**base, "MROWS": 16}
    assert ROWS.check(sixteen, GemmProblem(12, 2048, 1024), H200) is None
    assert pool.submit(ROWS, sixteen, "bf16", "sm_90a").result().cubin != base_cubin
    assert {p.name for p in ROWS.params} == set(changes) | {"KP", "MROWS"}
