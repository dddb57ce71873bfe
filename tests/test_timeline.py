"""benchmarks/timeline_h200.py: per-CTA phase records -> launches, phases and a chain summary;
the TUNEFW_TIMELINE build of wgmma_sm90 (and only it) carries the buffer the script reads."""
import importlib.util
from pathlib import Path

import pytest

from tunefw.cuda.compiler import compile_kernel
from tunefw.templates import FAMILIES

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "timeline_h200.py"
spec = importlib.util.spec_from_file_location("timeline_h200", SCRIPT)
timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timeline)


def _cta(entry_ns: int, offsets_ns: list[int], block: int, sm: int, clock_ghz: float = 1.5,
         units: int = 1) -> list[int]:
    """A slot's 18 words: events at entry + offsets (0: not reached), clocks at clock_ghz."""
    words = []
    for off in offsets_ns:
        ns = entry_ns + off if off is not None else 0
        words += [ns, int(off * clock_ghz) if off is not None else 0]
    return words + [(sm << 32) | block, units]


# entry, setup, first TMA, last TMA, first stage, main loop done, epilogue done, exit (ns after entry)
CTA = [0, 500, 900, 9_000, 2_000, 10_000, 11_000, 11_500]


def test_a_chain_splits_into_launches_with_phases_ramp_tail_and_gaps():
    raw = []
    # launch 1: CTAs enter at 1000, 1100, 1300 us-ish offsets (ns); the last one exits 2 us later
    for i, (entry, extra) in enumerate([(100_000, 0), (100_100, 0), (100_300, 2_000)]):
        raw += _cta(entry, [o + (extra if j == 7 else 0) for j, o in enumerate(CTA)], i, i)
    # launch 2 starts 400 ns after launch 1's last exit (100_300 + 13_500)
    for i, entry in enumerate([114_200, 114_250, 114_300]):
        raw += _cta(entry, CTA, i, i)
    raw += [0] * timeline.WORDS  # a slot no CTA wrote
    ctas = timeline.records(raw, 7)
    assert len(ctas) == 6 and ctas[2]["sm"] == 2 and ctas[2]["block"] == 2
    groups = timeline.launches(ctas[::-1], 3)  # any slot order: grouped by entry time
    first, second = (timeline.phases(g) for g in groups)
    assert first["ramp_us"] == pytest.approx(0.3) and first["ctas"] == 3
    assert first["span_us"] == pytest.approx(13.8)  # entry 100_000 -> exit 113_800
    assert first["tail_us"] == pytest.approx(113.8 - 111.6)  # last exit after the median one
    assert first["setup"] == {"median_us": 0.5, "max_us": 0.5}
    assert first["first_data"]["median_us"] == pytest.approx(1.1)
    assert first["mainloop"]["median_us"] == pytest.approx(8.0)
    assert first["exit"]["max_us"] == pytest.approx(2.5)
    assert first["sm_clock_mhz"] == pytest.approx(1500.0)
    assert not first["mixed"]
    summary = timeline.chain_summary([first, second])
    assert summary["gap_us"] == pytest.approx(0.4)
    assert summary["span_us"] == second["span_us"]  # launches after the first (cold) one
    assert summary["mainloop_us"] == pytest.approx(8.0) and summary["mixed_launches"] == 0


def test_a_phase_counts_only_ctas_that_reached_both_events():
    idle = list(CTA)
    idle[2] = idle[3] = idle[4] = idle[5] = None  # a persistent CTA without a work unit
    raw = _cta(5, CTA, 0, 0) + _cta(5, idle, 1, 1, units=0)
    launch = timeline.phases(timeline.records(raw, 2))
    assert launch["first_data"] == {"median_us": 1.1, "max_us": 1.1}  # the working CTA alone
    assert launch["setup"]["median_us"] == 0.5


def test_overlapping_launches_show_as_a_mixed_group():
    raw = _cta(1000, CTA, 0, 0) + _cta(1010, CTA, 0, 1) + _cta(1020, CTA, 1, 2) + _cta(1030, CTA, 1, 3)
    first, second = (timeline.phases(g) for g in timeline.launches(timeline.records(raw, 4), 2))
    assert first["mixed"] and second["mixed"]


def test_only_the_timeline_build_carries_the_buffer(tmp_path):
    sources = timeline.timeline_sources(tmp_path)
    assert (sources / "wgmma_sm90.cuh").read_text().startswith("#define TUNEFW_TIMELINE 1\n")
    template = FAMILIES["wgmma_sm90"]
    config = template.default_config()
    tuned = compile_kernel(template, config, "bf16", "sm_90a", cache_dir=tmp_path / "cache")
    timed = compile_kernel(template, config, "bf16", "sm_90a", cache_dir=tmp_path / "cache",
                           source_dir=sources)
    assert tuned.ok and timed.ok
    assert b"tunefw_timeline" in timed.cubin and b"tunefw_timeline" not in tuned.cubin


def test_a_variant_defines_its_switches_after_the_timeline_and_overrides_parse_to_knobs(tmp_path):
    name, defines = timeline.parse_variant("light=TUNEFW_EXP_A,TUNEFW_EXP_B=2")
    head = (timeline.timeline_sources(tmp_path, defines) / "wgmma_sm90.cuh").read_text()
    assert (name, head.splitlines()[:3]) == ("light", ["#define TUNEFW_TIMELINE 1",
                                                       "#define TUNEFW_EXP_A",
                                                       "#define TUNEFW_EXP_B 2"])
    assert timeline.parse_variant("base=") == ("base", ())
    other = timeline.timeline_sources(tmp_path / "stream", ("TUNEFW_EXP_A",), "stream_sm90")
    assert (other / "stream_sm90.cuh").read_text().splitlines()[1] == "#define TUNEFW_EXP_A"
    assert not (other / "wgmma_sm90.cuh").read_text().startswith("#define")
    assert timeline.parse_override("64x4096x4096:BN=32,SCHEDULE=pingpong") == (
        (64, 4096, 4096), {"BN": 32, "SCHEDULE": "pingpong"})
    for bad in ("64x4096:BN=32", "64x4096x4096:", "64xAx4096:BN=32"):
        with pytest.raises(SystemExit, match="expected MxNxK:KNOB=VALUE"):
            timeline.parse_override(bad)
    with pytest.raises(SystemExit, match="expected NAME=DEFINE"):
        timeline.parse_variant("=TUNEFW_EXP_A")


@pytest.mark.gpu
def test_the_timeline_buffer_is_found_cleared_and_read_through_the_driver(tmp_path):
    from tunefw.cuda import driver

    template = FAMILIES["wgmma_sm90"]
    built = compile_kernel(template, template.default_config(), "bf16", "sm_90a",
                           cache_dir=tmp_path / "cache",
                           source_dir=timeline.timeline_sources(tmp_path))
    driver.set_current(driver.primary_context(driver.device(0)))
    module, _ = driver.load(built.cubin, built.lowered_name)
    ptr, size = driver.module_global(module, "tunefw_timeline")
    assert size == timeline.CAPACITY * timeline.WORDS * 8
    driver.zero_device(ptr, size)
    assert driver.read_device(ptr, size) == bytes(size)
    driver.unload(module)
