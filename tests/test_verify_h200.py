"""benchmarks/verify_h200.py without a GPU: its plans, how it judges fault and table verdicts, and
the result file's summary when a part fails."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from faults.fault_family import EXPECTED, FAULTS
from tunefw.export.table import render
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable
from tunefw.templates import get_family

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "verify_h200.py"
spec = importlib.util.spec_from_file_location("verify_h200", SCRIPT)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)

DEVICE = {"name": "NVIDIA H200", "driver": "580.159.04", "sm_clock_mhz": 1980}
SKINNY = get_family("skinny_sm90")


def _fault_result(changed: dict[str, str] | None = None, left_out: str | None = None) -> dict:
    rows = [{"config": {"fault": f}, "status": (changed or {}).get(f, EXPECTED[f]), "log": "x"}
            for f in FAULTS if f != left_out]
    return {"device": DEVICE, "rows": rows}


def _table(tmp_path: Path) -> Path:
    config = {**SKINNY.default_config(), "MTILES": 1, "BN": 16, "CK": 1, "WARPS": 1, "KV": 1}
    entries = [DispatchEntry(1, 4096, 4096, "bf16", "TN", "skinny_sm90", config, 3.0, 2.0, 1)]
    path = tmp_path / "dispatch_a.json"
    path.write_text(render(DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, entries), "json"))
    return path


def test_every_fault_is_planned_once_through_the_family_file():
    assert sorted(j.config["fault"] for j in script.fault_jobs()) == sorted(FAULTS)
    assert set(script.ACCEPTANCE_FAULTS) <= set(FAULTS)


def test_faults_as_expected_and_one_that_slipped_through():
    judged = script.judge_faults(_fault_result())
    assert judged["all_as_expected"] and judged["missing"] == []
    assert judged["acceptance_caught"] == dict.fromkeys(script.ACCEPTANCE_FAULTS, True)
    judged = script.judge_faults(_fault_result({"splitk_dirty": "OK"}, left_out="spill"))
    assert judged["acceptance_caught"]["splitk_dirty"] is False and not judged["all_as_expected"]
    assert judged["missing"] == ["spill"]


def test_tables_are_planned_per_file_and_an_unreadable_one_is_skipped(tmp_path):
    good, bad = _table(tmp_path), tmp_path / "dispatch_b.json"
    bad.write_text("{not json")
    tables, jobs, owners = script.table_jobs([good, bad], [], 90)
    assert [(t["jobs"], t["skipped"] is None) for t in tables] == [(1, True), (0, False)]
    assert tables[0]["fingerprint"]["cc"] == 90 and owners == [str(good)]
    assert "dispatch_b.json" in tables[1]["skipped"]
    old_gpu = script.table_jobs([good], [], 80)[0][0]  # skinny_sm90 needs sm_90
    assert old_gpu["skipped"] == "ValueError: families skinny_sm90 need a newer GPU than cc 80"

    row = {"family": "skinny_sm90", "M": 1, "N": 4096, "K": 4096, "source": "entry 1x4096x4096"}
    judged = script.judge_tables(tables, owners, {"device": DEVICE, "rows": [{**row, "status": "OK"}]})
    assert judged["all_pass"] and judged["tables"][0]["own_shapes_ok"] == 1
    assert judged["tables"][1]["pass"] is None  # skipped, not failed
    tables, jobs, owners = script.table_jobs([good], [], 90)
    judged = script.judge_tables(tables, owners, {"device": DEVICE,
                                                  "rows": [{**row, "status": "WRONG_ANSWER"}]})
    assert not judged["all_pass"] and judged["failures"][0]["table"] == str(good)


def test_a_failed_part_fails_its_point_and_the_others_stand():
    def broken() -> dict:
        raise RuntimeError("the GPU worker process did not start")
    guarded = script.gpu_result.guarded
    parts = {"faults": guarded(lambda: script.judge_faults(_fault_result())),
             "tables": guarded(broken),
             "sweep": guarded(lambda: {"trials_per_s": 7.5, "gpu_busy": {"0": 0.97},
                                       "trials": 300, "wrong": 0})}
    assert parts["tables"]["error"] == "RuntimeError: the GPU worker process did not start"
    result = script.compose(parts, "abc123", 0.0)
    summary = result["summary"]
    assert [summary[p]["pass"] for p in ("faults_caught", "winners_pass", "runtime_first_use",
                                         "sweep_rate")] == [True, False, False, True]
    assert summary["all_pass"] is False and result["commit"] == "abc123"
    assert result["device"]["name"] == "NVIDIA H200" and result["device"]["sm_clock_mhz"] == 1980
    slow = script.summarize({**parts, "sweep": {"trials_per_s": 4.9}})
    assert slow["sweep_rate"]["pass"] is False
    assert json.loads(json.dumps(result)) == result  # plain JSON, nothing lost


def test_the_dry_run_prints_the_plan(capsys, tmp_path):
    assert script.main(["--dry-run", "--tables", str(_table(tmp_path)), "--table-shapes", ""]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert sorted(planned["faults"]) == sorted(FAULTS) and planned["table_jobs"] == 1
    assert planned["runtime_shapes"] == 1
    assert planned["study"] == {"name": "throughput_4096", "trials": 300}


def test_the_runtime_part_lists_the_shapes_a_table_sends_to_a_kernel_and_judges_them(tmp_path):
    path = _table(tmp_path)
    edge = [GemmProblem(1, 4096, 4096), GemmProblem(4096, 4096, 4096), GemmProblem(2, 4096, 4096)]
    shapes = script.runtime_shapes(path, edge)
    assert shapes[0] == GemmProblem(1, 4096, 4096) and GemmProblem(4096, 4096, 4096) not in shapes
    rows = [{"table": "t", "shape": "1x4096x4096:bf16:TN", "verified": True},
            {"table": "t", "shape": "2x4096x4096:bf16:TN", "verified": False,
             "reason": "the kernel ... failed strict verification on this shape (x)"}]
    judged = script.judge_runtime(rows)
    assert judged["checked"] == 2 and not judged["all_pass"] and judged["failures"] == rows[1:]
    assert script.judge_runtime(rows[:1])["all_pass"] and not script.judge_runtime([])["all_pass"]
