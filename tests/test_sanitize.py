"""`tunefw verify --sanitize`: the tools it takes, what it reads out of compute-sanitizer's texts
(tests/data/sanitizer), its one-line refusals, the sanitized run's plumbing under a stand-in
sanitizer; on a GPU, a sanitized verification end to end."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import _has_gpu, invoke_cli, one_line_error, run_cli
from tunefw.errors import UserError
from tunefw.measure import sanitize
from tunefw.measure.sanitize import (REPORT_LINES, errors_in, parse_tools, report_lines,
                                     tool_result, verdict)
from tunefw.measure.verify import plan
from tunefw.problem import GemmProblem

FIXTURES = Path(__file__).resolve().parent / "data" / "sanitizer"
# Stands in for compute-sanitizer: records its options and the environment it was given, then
# runs the program after the options (or sleeps, to be stopped) and prints a clean summary.
FAKE = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_LOG"
echo "PYTORCH_NO_CUDA_MEMORY_CACHING=$PYTORCH_NO_CUDA_MEMORY_CACHING" >> "$FAKE_LOG"
[ -n "$FAKE_SLEEP" ] && sleep "$FAKE_SLEEP"
while [ "${1#--}" != "$1" ]; do shift; done
echo "========= COMPUTE-SANITIZER"
"$@"
code=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $code
"""
OK2 = [{"status": "OK"}, {"status": "OK"}]
no_gpu = pytest.mark.skipif(_has_gpu(), reason="what happens without a GPU")


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def fake_sanitizer(tmp_path, monkeypatch) -> Path:
    """A stand-in compute-sanitizer first on PATH; its log file."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.log"))
    return tmp_path / "fake.log"


@pytest.mark.parametrize("text, tools", [
    ("memcheck", ["memcheck"]), ("racecheck", ["racecheck"]),
    ("memcheck,racecheck", ["memcheck", "racecheck"]),
    (" racecheck , memcheck,racecheck", ["racecheck", "memcheck"])])
def test_the_tools_come_comma_separated_each_once(text, tools):
    assert parse_tools(text) == tools


@pytest.mark.parametrize("text", ["", ",", "initcheck", "memcheck,bogus", "MEMCHECK"])
def test_any_other_tool_is_refused(text):
    with pytest.raises(UserError, match=r"^--sanitize .*: expected memcheck, racecheck or both"):
        parse_tools(text)


@pytest.mark.parametrize("tool, fixture, errors", [
    ("memcheck", "memcheck_clean.txt", 0), ("racecheck", "racecheck_clean.txt", 0),
    ("memcheck", "memcheck_oob.txt", 28),  # the total, not the "8 errors were not printed" line
    ("racecheck", "racecheck_hazard.txt", 1),  # errors only: its warning is not one
    ("memcheck", "device_not_supported.txt", None),
    ("racecheck", "device_not_supported.txt", None)])
def test_the_errors_a_summary_counts(tool, fixture, errors):
    assert errors_in(tool, _text(fixture)) == errors


def test_the_summaries_of_several_processes_add_up():
    assert errors_in("memcheck", _text("memcheck_oob.txt") + _text("memcheck_clean.txt")) == 28
    assert errors_in("racecheck", _text("racecheck_hazard.txt") * 2) == 2


def test_the_report_keeps_the_findings_not_the_banner_or_the_summaries():
    oob = report_lines(_text("memcheck_oob.txt"))
    assert oob[:2] == ["Invalid __global__ write of size 2 bytes",
                       "    at void mma_sm80_gemm<128, 128, 32, 64, 64, 4, 0>(const "
                       "__nv_bfloat16 *, const __nv_bfloat16 *, __nv_bfloat16 *, int, int, "
                       "int)+0x2f70"]
    assert not any("SUMMARY" in line or "COMPUTE-SANITIZER" in line for line in oob)
    assert "verified 1 config-shape pairs" not in oob  # the program's own output is not its
    assert report_lines(_text("racecheck_hazard.txt"))[0].startswith(
        "Error: Race reported between Write access at void wgmma_sm90_gemm<")
    assert report_lines(_text("memcheck_clean.txt")) == []
    assert len(report_lines(_text("memcheck_oob.txt") * 10)) == REPORT_LINES


def test_a_tool_is_clean_with_no_error_and_every_job_verified():
    clean = tool_result("memcheck", _text("memcheck_clean.txt"), OK2, 2, 0)
    assert (clean["errors"], clean["clean"], clean["all_ok"], clean["verified"]) == (0, True, True, 2)
    assert (clean["statuses"], clean["note"], verdict(clean)) == ({"OK": 2}, None, "clean")
    found = tool_result("memcheck", _text("memcheck_oob.txt"), OK2, 2, 0)
    assert (found["clean"], found["report"][0], verdict(found)) == (
        False, "Invalid __global__ write of size 2 bytes", "NOT CLEAN: 28 error(s)")
    wrong = tool_result("racecheck", _text("racecheck_clean.txt"),
                        [{"status": "OK"}, {"status": "WRONG_ANSWER"}], 2, 0)
    assert (wrong["clean"], wrong["all_ok"], wrong["statuses"]) == (
        True, False, {"OK": 1, "WRONG_ANSWER": 1})
    assert verdict(wrong) == "clean (but not every verdict is OK)"


def test_a_run_without_summary_or_without_every_verdict_is_not_clean():
    refused = tool_result("memcheck", _text("device_not_supported.txt"), [], 2, 1)
    assert (refused["errors"], refused["clean"]) == (None, False)
    assert verdict(refused) == "NOT CLEAN: the sanitizer printed no summary"
    crashed = ("========= COMPUTE-SANITIZER\nTraceback (most recent call last):\n"
               "RuntimeError: CUDA error: an illegal memory access was encountered\n"
               "========= ERROR SUMMARY: 0 errors\n")
    short = tool_result("memcheck", crashed, OK2[:1], 2, 1)
    assert (short["errors"], short["clean"], short["all_ok"]) == (0, False, False)
    assert short["note"] == ("verified 1 of 2 jobs (exit 1): RuntimeError: CUDA error: an "
                             "illegal memory access was encountered")


def test_each_tools_entry_and_verdicts_join_the_result(monkeypatch):
    texts = {"memcheck": "memcheck_clean.txt", "racecheck": "racecheck_hazard.txt"}
    verdicts = {"memcheck": OK2, "racecheck": [{"status": "OK"}, {"status": "WRONG_ANSWER"}]}
    monkeypatch.setattr(sanitize, "run_tool", lambda tool, jobs, cache_dir=None, **_: tool_result(
        tool, _text(texts[tool]), verdicts[tool], len(jobs), 0))
    result = {"rows": [{"status": "OK"}, {"status": "OK"}]}
    sanitize.sanitize(result, ["job-a", "job-b"], ["memcheck", "racecheck"])
    assert [row["sanitize"] for row in result["rows"]] == [
        {"memcheck": "OK", "racecheck": "OK"}, {"memcheck": "OK", "racecheck": "WRONG_ANSWER"}]
    assert [(e["tool"], e["errors"], e["clean"]) for e in result["sanitize"]] == [
        ("memcheck", 0, True), ("racecheck", 1, False)]
    assert result["sanitize_clean"] is False
    assert all("verdicts" not in e for e in result["sanitize"])  # in the rows


def _jobs():
    return plan("skinny_sm90", [GemmProblem(1, 8, 8)], sample=1, seed=0)


@no_gpu
def test_the_verification_runs_under_the_tool_with_each_buffer_its_own(fake_sanitizer):
    entry = sanitize.run_tool("racecheck", _jobs())
    told = fake_sanitizer.read_text().splitlines()
    assert told[:4] == ["--tool=racecheck", "--target-processes=all", "--print-limit=20",
                        "--report-api-errors=no"]
    assert told[5:7] == ["-m", "tunefw.measure.sanitize"]
    assert told[-1] == "PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    # the child ran the verification, which found no GPU here: no verdict, so not clean
    assert (entry["errors"], entry["verified"], entry["clean"]) == (0, 0, False)
    assert entry["note"] == ("verified 0 of 1 jobs (exit 1): tunefw.errors.UserError: "
                             "tunefw verify needs a CUDA GPU (none is visible)")


def test_a_run_past_its_time_is_stopped_and_not_clean(fake_sanitizer, monkeypatch):
    monkeypatch.setenv("FAKE_SLEEP", "120")
    entry = sanitize.run_tool("memcheck", _jobs(), timeout_s=1)
    assert (entry["note"], entry["clean"], entry["verified"]) == ("stopped after 1 s", False, 0)


def test_a_bad_tool_is_one_line_before_anything_runs():
    done = invoke_cli("verify", "skinny_sm90", "--shapes", "edge", "--sample", "1",
                      "--sanitize", "memcheck,initcheck")
    one_line_error(done.returncode, done.stderr, "--sanitize 'memcheck,initcheck': expected")


def test_without_compute_sanitizer_on_path_it_is_one_line(tmp_path):
    done = invoke_cli("verify", "skinny_sm90", "--shapes", "edge", "--sample", "1",
                      "--sanitize", "memcheck", env={"PATH": str(tmp_path)})
    one_line_error(done.returncode, done.stderr, "--sanitize needs compute-sanitizer on PATH")


@no_gpu
def test_without_a_gpu_it_is_one_line(fake_sanitizer):
    done = invoke_cli("verify", "skinny_sm90", "--shapes", "edge", "--sample", "1",
                      "--sanitize", "memcheck,racecheck")
    assert done.stderr.strip().splitlines() == [
        "tunefw: error: tunefw verify needs a CUDA GPU (none is visible)"]
    assert fake_sanitizer.exists() is False  # refused before any sanitized run


@pytest.mark.gpu
def test_a_sanitized_verification_records_each_tool(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1x8x8\n7x136x264\n")
    out = tmp_path / "r.json"
    done = run_cli("verify", "skinny_sm90", "--shapes", str(shapes), "--sample", "1",
                   "--sanitize", "memcheck,racecheck", "--out", str(out), timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert [(e["tool"], e["errors"], e["clean"], e["verified"]) for e in result["sanitize"]] == [
        ("memcheck", 0, True, 2), ("racecheck", 0, True, 2)]
    assert [r["sanitize"] for r in result["rows"]] == [{"memcheck": "OK", "racecheck": "OK"}] * 2
    assert result["sanitize_clean"] is True and "under compute-sanitizer" in done.stdout


def test_the_sanitizer_script_samples_only_configs_of_the_asked_knobs():
    """benchmarks/sanitize_h200.py --where SWAP_AB=1 --split-k: every sampled config is a
    swap-AB split-K config valid on each of the script's shapes (the path it must cover)."""
    import importlib.util
    from conftest import REPO
    from tunefw.device import H200
    from tunefw.problem import GemmProblem
    from tunefw.templates import get_family
    spec = importlib.util.spec_from_file_location("sanitize_h200", REPO / "benchmarks" / "sanitize_h200.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.SHAPES[:] = [(17, 24, 40), (129, 136, 264), (200, 1000, 520)]
    assert script.parse_where("SWAP_AB=1,EPILOGUE=direct") == {"SWAP_AB": 1, "EPILOGUE": "direct"}
    configs = script.sample_configs("wgmma_sm90", 4, 0, True, {"SWAP_AB": 1})
    wgmma = get_family("wgmma_sm90")
    assert len(configs) == 4 and all(c["SWAP_AB"] == 1 and c["SPLIT_K"] > 1 for c in configs)
    assert all(wgmma.check(c, GemmProblem(*s), H200) is None for c in configs for s in script.SHAPES)
