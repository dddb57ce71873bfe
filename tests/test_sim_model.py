"""The SIMULATED cost model takes what it needs of a config from the family (its cost hint), so a
family with other knob names runs in sim; its figures are deterministic and unchanged."""
from __future__ import annotations

import pytest

from tunefw.device import DeviceSpec
from tunefw.evaluate.sim import model_time_ms
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES, get_family
from tunefw.templates.base import Config, CostHint, KernelTemplate, Param, Resources

MMA, WGMMA = get_family("mma_sm80"), get_family("wgmma_sm90")
BIG, SKINNY = (4096, 4096, 4096), (128, 6144, 4096)
# model_time_ms before the model read the cost hint (it read config["BM"] etc. itself).
PINNED = [
    (MMA.default_config(), BIG, 0.33107701067453327),
    (MMA.default_config(), SKINNY, 0.0818439335632913),
    (MMA.seed_configs()[5], BIG, 0.30957813688680985),
    ({**MMA.default_config(), "SWIZZLE": 0}, BIG, 0.3837350391250266),
    ({**MMA.default_config(), "SWIZZLE": 0}, SKINNY, 0.0988663159045391),
    (WGMMA.default_config(), BIG, 0.1667581918611476),
    (WGMMA.default_config(), SKINNY, 0.048238944732401506),
    (WGMMA.seed_configs()[5], BIG, 0.16391158864882677),
    (WGMMA.seed_configs()[8], BIG, 0.192970497411507),
    (WGMMA.seed_configs()[8], SKINNY, 0.02208308148148148),
]


@pytest.mark.parametrize("config, shape, expected", PINNED)
def test_the_model_gives_the_figures_it_gave_before(config, shape, expected):
    family = MMA if "WM" in config else WGMMA
    assert model_time_ms(family.family, config, GemmProblem(*shape)) == pytest.approx(expected, rel=1e-12)


class RowsCols(KernelTemplate):
    """A family whose knobs are named unlike BM/BN/BK: it tells the model what they mean."""

    family = "rows_cols"
    source = "rows_cols.cuh"
    kernel = "rows_cols"
    params = (Param("ROWS", (64, 128), "tile rows"), Param("COLS", (64, 128), "tile columns"),
              Param("DEPTH", (32, 64), "tile depth"))

    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        return None

    def estimate(self, config: Config) -> Resources:
        return Resources(threads=128, regs_per_thread=128,
                         smem_bytes=3 * (config["ROWS"] + config["COLS"]) * config["DEPTH"] * 2)

    def cost_hint(self, config: Config) -> CostHint:
        return CostHint(tile_m=config["ROWS"], tile_n=config["COLS"], tile_k=config["DEPTH"],
                        efficiency=0.6)


def test_a_family_with_other_knob_names_runs_in_sim(monkeypatch):
    monkeypatch.setitem(FAMILIES, "rows_cols", RowsCols())
    problem = GemmProblem(*BIG)
    times = {(r, c): model_time_ms("rows_cols", {"ROWS": r, "COLS": c, "DEPTH": 64}, problem)
             for r in (64, 128) for c in (64, 128)}
    assert times[(128, 128)] < times[(64, 64)]  # the model sees the tile the family names
    assert times == {k: model_time_ms("rows_cols", {"ROWS": k[0], "COLS": k[1], "DEPTH": 64},
                                      problem) for k in times}  # deterministic


def test_the_default_hint_reads_the_conventional_knobs():
    hint = KernelTemplate.cost_hint(MMA, {**MMA.default_config(), "SWIZZLE": 0})
    assert (hint.tile_m, hint.tile_n, hint.tile_k, hint.split_k, hint.stages, hint.swizzled) == \
        (128, 128, 32, 1, 4, False)
    assert MMA.cost_hint(MMA.default_config()).efficiency == 0.47
    assert WGMMA.cost_hint(WGMMA.default_config()).efficiency == 0.86
