"""The CPU side of the model-table GPU run (benchmarks/model_table_h200.py and
dispatch_guard_h200.py): the study the committed Llama-3-8B config gives, the shapes the dispatch
acceptance serves and calibrates, its verdicts, and the phases' budget and resumption."""
from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from conftest import invoke_cli

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import dispatch_guard_h200 as guard_run  # noqa: E402
import dispatch_guard_plan as guard  # noqa: E402
import model_table_h200 as mt  # noqa: E402
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, load  # noqa: E402
from tunefw.templates import FAMILIES  # noqa: E402

CONFIG = REPO / mt.DEFAULTS["model"]
GRID = (1, 16, 64, 512, 2048)
HF_LAYERS = {(4096, 4096): "q_proj-o_proj", (1024, 4096): "k_proj-v_proj",
             (14336, 4096): "gate_proj-up_proj", (4096, 14336): "down_proj",
             (128256, 4096): "lm_head"}


def _table(layers=HF_LAYERS, grid=GRID) -> DispatchTable:
    config = FAMILIES["wgmma_sm90"].default_config()
    entries = [DispatchEntry(m, n, k, "bf16", "TN", "wgmma_sm90", config, 500.0, 450.0, i, label=label)
               for i, ((n, k), label) in enumerate(layers.items()) for m in grid]
    return DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, entries)


def test_the_committed_config_gives_every_gemm_the_hf_benchmark_runs():
    pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefw[hf]')")
    from hf_llama_h200 import DECODE_BATCHES, PREFILL_TOKENS, linear_shapes
    from hf_llama_steps import LLAMA3_8B, build_model
    from tunefw.study.model_shapes import model_shapes

    found = model_shapes(CONFIG, mt.DEFAULTS["m_grid"])
    assert {(s.N, s.K): s.label for s in found.shapes} == HF_LAYERS and not found.invalid
    bench = build_model(LLAMA3_8B, 2, torch.device("meta"))  # the benchmark's own model
    assert set(linear_shapes(bench)) == set(HF_LAYERS)
    problems = {(p["M"], p["N"], p["K"]) for p in found.problems()}
    lm_head = (LLAMA3_8B["vocab_size"], 4096)
    served = {(b, n, k) for b in DECODE_BATCHES for n, k in HF_LAYERS}  # decode: M = batch
    served |= {(t if (n, k) != lm_head else 1, n, k) for t in PREFILL_TOKENS for n, k in HF_LAYERS}
    assert served <= problems  # every case's GEMM is an exact entry of the study


def test_the_study_command_creates_the_models_problems_with_the_decode_families(db_url):
    pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefw[hf]')")
    args = mt.parse_args([])
    cmd = mt.commands(args, mt.State(Path("unused")), 300)["study"]
    made = invoke_cli(*cmd[cmd.index("study"):], db=db_url, cwd=REPO)
    assert made.returncode == 0, made.stderr
    shown = json.loads(invoke_cli("study", "show", args.study, "--json", db=db_url).stdout)
    assert {(p["M"], p["N"], p["K"]) for p in shown["problems"]} == {
        (m, n, k) for n, k in HF_LAYERS for m in GRID}
    from tunefw.store import open_store
    from tunefw.store import queries as q
    with open_store(db_url).session() as s:
        spec = q.get_study(s, args.study).spec
    assert (spec["families"], spec["trials"], spec["confirm_top"]) == (list(mt.FAMILIES), 24, 2)


def test_untuned_shapes_span_m_and_other_models_and_calibration_never_measures_them():
    table = _table()
    shapes = guard.plan_shapes(table)
    layer = [s for s in shapes if s["kind"] == "layer"]
    other = [s for s in shapes if s["kind"] == "other model"]
    assert len(layer) >= 40 and len(other) == 8
    assert not {(s["M"], s["N"], s["K"]) for s in shapes} & {(e.M, e.N, e.K) for e in table.entries}
    assert {s["M"] for s in layer} >= {3, 7, 33, 129, 1025, 4097, 8192}  # odd M, up to 8192
    assert max(s["M"] for s in layer if s["N"] == 128256) == guard.WIDE_MAX_M  # lm_head: decode M
    assert not {(o["N"], o["K"]) for o in other} & set(HF_LAYERS)
    cal = guard.calibration_shapes(table)
    keys = {(s["M"], s["N"], s["K"]) for s in cal}
    assert not keys & {(s["M"], s["N"], s["K"]) for s in shapes}
    assert {(m, 4096, 4096) for m in (2, 4, 15, 17, 181, 513, 2047, 4096)} <= keys
    assert {(m, 6144, 4096) for m in GRID} <= keys  # another model's layer at the tuned M ...
    assert {(m, 3584, 3584) for m in (2, 4, 15, 513, 2047)} <= keys  # ... and in between
    # The fused layout's table gets the unfused layers as its other models
    fused = guard.plan_shapes(_table({(6144, 4096): "qkv", (4096, 4096): "o_proj",
                                      (28672, 4096): "gate_up", (4096, 14336): "down"}))
    assert {(s["N"], s["K"]) for s in fused if s["kind"] == "other model"} == {
        (1024, 4096), (14336, 4096), (3584, 3584), (3584, 18944)}


def _rows(ratio=1.05, guard_ms=1.0, wrong=False):
    row = {"M": 3, "N": 4096, "K": 4096, "ratio": ratio, "guard_ms": guard_ms, "guard_pair_ms": 0.1,
           "wrong": wrong}
    fast = {**row, "M": 5, "ratio": 1.05, "guard_ms": 1.0, "wrong": False}
    on = [row] + [fast] * (guard.MIN_UNTUNED - 1)
    return {"guard_on": on, "guard_off": [{**r, "same_route_as_guard_on": True} for r in on],
            "exact": [{"M": 16, "N": 4096, "K": 4096, "ratio_to_confirmed": 0.99}],
            "compile": [{"M": 3, "N": 4096, "K": 4096, "wrong": False}],
            "graph": [{"M": 3, "N": 4096, "K": 4096, "wrong": False}]}


def test_the_summary_passes_only_what_the_issue_asks():
    assert guard.summarize(_rows())["all"]
    slow = guard.summarize(_rows(ratio=0.96))
    assert not slow["untuned_never_slower"]["ok"] and slow["untuned_never_slower"]["below"] == [
        "3x4096x4096 0.960"]
    assert not slow["all"] and slow["untuned_geomean"]["ok"]  # 47 at 1.05x and one at 0.96x
    few = _rows()
    few["guard_on"] = few["guard_on"][:-1]  # a shape short of the issue's 48
    assert not guard.summarize(few)["untuned_never_slower"]["ok"]
    even = guard.summarize(_rows())["untuned_geomean"]
    assert even["ok"] and abs(even["geomean"] - 1.05) < 1e-9
    costly = guard.summarize(_rows(guard_ms=3.5))["guard_cost"]
    assert not costly["ok"] and costly["over"] == ["3x4096x4096 3.50 ms (pair 0.10)"]
    wrong = guard.summarize(_rows(wrong=True))["correct_everywhere"]
    assert not wrong["ok"] and wrong["wrong"]["guard_on"] == ["3x4096x4096"]
    rows = _rows()
    rows["exact"][0]["ratio_to_confirmed"] = 0.97
    rows["graph"] = [{"M": 3, "N": 4096, "K": 4096, "wrong": True, "error": "RuntimeError: x"}]
    summary = guard.summarize(rows)
    assert not summary["exact_at_tuned_speed"]["ok"] and not summary["correct_everywhere"]["ok"]
    assert summary["correct_everywhere"]["errors"] == ["graph 3x4096x4096: RuntimeError: x"]


def test_the_summary_counts_unproven_routes_by_what_served_them():
    rows = _rows()
    paths = ["guarded", "cublas", "unproven"] + ["bucket"] * (len(rows["guard_on"]) - 3)
    rows["guard_on"] = [{**r, "M": i, "path": p} for i, (r, p) in enumerate(zip(rows["guard_on"], paths))]
    rows["guard_off"] = [{**r, "path": "unproven" if r["path"] in ("guarded", "cublas") else r["path"]}
                         for r in rows["guard_on"]]
    summary = guard.summarize(rows)
    on, off = summary["untuned_never_slower"], summary["guard_off_calibrated"]
    # after the first call an unproven route the guard measured is guarded (kept) or cublas
    assert on["paths"] == {"bucket": len(paths) - 3, "cublas": 1, "guarded": 1, "unproven": 1}
    assert on["unproven_unmeasured"] == ["2x4096x4096"]  # served by cuBLAS, never timed
    assert off["paths"] == {"bucket": len(paths) - 3, "unproven": 3}  # guard off: cuBLAS
    assert summary["all"]


def test_each_shape_s_failure_or_the_deadline_is_a_row_not_the_end():
    def measure(i, s):
        if s["M"] == 2:
            raise RuntimeError("CUDA error: an illegal memory access\nmore")
        return {**s, "ratio": 1.0}

    shapes = [{"M": m, "N": 8, "K": 8} for m in (1, 2, 3)]
    assert guard_run.each(shapes, measure) == [
        {"M": 1, "N": 8, "K": 8, "ratio": 1.0},
        {"M": 2, "N": 8, "K": 8, "wrong": True, "error": "RuntimeError: CUDA error: an illegal memory access"},
        {"M": 3, "N": 8, "K": 8, "ratio": 1.0}]
    assert [r.get("skipped") for r in guard_run.each(shapes, measure, deadline=0.0)] == ["time budget"] * 3


def test_phases_stop_at_the_budget_and_resume_from_the_packed_state(tmp_path, monkeypatch):
    calls, killed, crash = [], [], []

    def fake_call(cmd, cwd, timeout):
        calls.append(cmd)
        if "launch" in cmd and killed == []:  # the first sweep outruns the run's budget
            killed.append(timeout)
            raise mt.subprocess.TimeoutExpired(cmd, timeout)
        if "--out" in cmd and Path(cmd[1]).name != "tunefw":  # a result script writes its file
            if crash:
                return 1
            Path(cmd[cmd.index("--out") + 1]).parent.mkdir(parents=True, exist_ok=True)
            Path(cmd[cmd.index("--out") + 1]).write_text("{}")
        return 0

    monkeypatch.setattr(mt.subprocess, "call", fake_call)
    monkeypatch.setattr(mt, "sweep_done", lambda state, study: True)
    monkeypatch.setattr(mt, "sweep_figures", lambda state, study: {"rows": [], "trials": 600})
    monkeypatch.setattr(mt, "export_phase", lambda cmd, state, timeout: {"entries": 25})
    monkeypatch.setattr(mt, "calibration_figures", lambda state: {"measured": 80})
    monkeypatch.setattr(mt, "write_calibration_shapes", lambda state: 128)
    out, tar = tmp_path / "out", mt.state_tar("hf_llama3_8b")
    run = lambda name, budget, resume: mt.main([  # noqa: E731
        "--state-dir", str(tmp_path / name), "--out", str(out / name), "--resume", str(resume),
        "--commit", "abc", "--budget-s", str(budget)])
    assert run("a", 200, tmp_path / "none.tar.gz") == 3  # the sweep needs 240 s: run again
    assert [c[c.index("--db") + 2] for c in calls] == ["study"]
    report = json.loads((out / "a" / "model_table_hf_llama3_8b_h200.json").read_text())
    assert list(report["phases"]) == ["study"] and not report["finished"]
    with pytest.raises(SystemExit, match="phase sweep: stopped at this run's budget"):
        run("b", 300, out / "a" / tar)  # resumed: no study create again
    assert [c[c.index("--db") + 2] for c in calls[1:]] == ["launch"] and killed[0] <= 300 - mt.PACK_S
    # the launch's time limit covers its confirmation: it gets all but the pack and the finish
    limit = int(calls[1][calls[1].index("--time-limit") + 1])
    assert 300 - mt.PACK_S - mt.FINISH_S - 10 <= limit <= 300 - mt.PACK_S - mt.FINISH_S
    with tarfile.open(out / "b" / tar) as f:  # packed even so
        assert "phases.json" in f.getnames()
    calls.clear()
    assert run("c", 600, out / "b" / tar) == 0
    assert [c[c.index("--db") + 2] if "--db" in c else Path(c[1]).name for c in calls] == [
        "launch", "hf_llama_h200.py", "dispatch", "dispatch_guard_h200.py"]
    guard_cmd = calls[3]
    assert guard_cmd[guard_cmd.index("--commit") + 1] == "abc"
    assert float(guard_cmd[guard_cmd.index("--budget-s") + 1]) <= 240
    again = json.loads((out / "c" / "model_table_hf_llama3_8b_h200.json").read_text())
    assert again["finished"] and len(again["runs"]) == 3 and list(again["phases"]) == list(mt.PHASES)
    crash.append(1)  # a result script that dies without its file: the phase stays undone
    with pytest.raises(SystemExit, match="phase hf: exited 1 without hf_llama_h200.json"):
        mt.main(["--state-dir", str(tmp_path / "c"), "--out", str(out / "e"), "--commit", "abc",
                 "--budget-s", "600", "--redo", "hf"])
    assert not mt.State(tmp_path / "c").done("hf")
    crash.clear()
    calls.clear()  # --redo: done phases run again (the measurement fixed), the sweep is kept
    assert mt.main(["--state-dir", str(tmp_path / "c"), "--out", str(out / "d"), "--commit", "abc",
                    "--budget-s", "600", "--redo", "guard,hf"]) == 0
    assert [Path(c[1]).name for c in calls] == ["hf_llama_h200.py", "dispatch_guard_h200.py"]
    with pytest.raises(SystemExit):
        mt.parse_args(["--redo", "sweeps"])
    calls.clear()  # --new-round: the launch starts a new round, the sweep and all after it redone
    assert mt.main(["--state-dir", str(tmp_path / "c"), "--out", str(out / "f"), "--commit", "abc",
                    "--budget-s", "600", "--new-round"]) == 0
    launch = calls[0]
    assert launch[launch.index("--db") + 2] == "launch" and launch[-1] == "--new-round"
    assert [c[c.index("--db") + 2] if "--db" in c else Path(c[1]).name for c in calls[1:]] == [
        "hf_llama_h200.py", "dispatch", "dispatch_guard_h200.py"]  # export is faked
    calls.clear()  # a later run resumes that round: no second new round
    assert mt.main(["--state-dir", str(tmp_path / "c"), "--out", str(out / "g"), "--commit", "abc",
                    "--budget-s", "600", "--redo", "sweep"]) == 0
    assert "--new-round" not in calls[0]
    assert (out / "g" / mt.table_result("hf_llama3_8b")).exists()
    # calibration to redo and no time for it: the last round's calibrated table stays behind
    assert mt.main(["--state-dir", str(tmp_path / "c"), "--out", str(out / "h"), "--commit", "abc",
                    "--budget-s", "100", "--redo", "calibrate"]) == 3
    assert mt.State(tmp_path / "c").calibrated.exists()
    assert not (out / "h" / mt.table_result("hf_llama3_8b")).exists()


def test_a_study_file_and_a_choice_of_phases():
    args = mt.parse_args(["--study-file", "studies/llama3_8b.yaml", "--study", "llama3_8b",
                          "--phases", "guard,study,sweep"])
    assert args.phases == ["study", "sweep", "guard"]  # run in the phases' own order
    assert (args.resume.name, args.state_dir) == ("llama3_8b_state.tar.gz", Path("/tmp/llama3_8b"))
    cmd = mt.commands(args, mt.State(Path("unused")), 300)["study"]
    assert cmd[cmd.index("create"):cmd.index("create") + 4] == [
        "create", "llama3_8b", "--from", "studies/llama3_8b.yaml"] and "--from-model" not in cmd
    with pytest.raises(SystemExit):
        mt.parse_args(["--phases", "sweep,plot"])


def test_a_study_file_keeps_its_own_name_and_budget_unless_overridden():
    """Issue 14's table is a sweep of studies/llama3_8b.yaml as it stands (64 trials, 60 s,
    top 3 confirmed), not the model run's shorter defaults; a flag still wins."""
    def created(argv):
        args = mt.parse_args(argv)
        cmd = mt.commands(args, mt.State(Path("unused")), 300)["study"]
        return args.study, {flag: cmd[cmd.index(flag) + 1]
                            for flag in ("--trials", "--timeout", "--confirm-top")}

    assert created(["--study-file", "studies/llama3_8b.yaml"]) == (
        "llama3_8b", {"--trials": "64", "--timeout": "60", "--confirm-top": "3"})
    assert created(["--study-file", "studies/llama3_8b.yaml", "--trials", "8"])[1]["--trials"] == "8"
    assert created([]) == (mt.DEFAULTS["study"], {
        "--trials": str(mt.DEFAULTS["trials"]), "--timeout": f"{mt.DEFAULTS['timeout']:g}",
        "--confirm-top": str(mt.DEFAULTS["confirm_top"])})


def test_calibration_writes_todays_shapes_from_the_exported_table(tmp_path):
    state = mt.State(tmp_path)
    state.table.write_text((REPO / "benchmarks/results/dispatch_hf_llama3_8b_h200.json").read_text())
    count = mt.write_calibration_shapes(state)
    lines = state.shapes.read_text().splitlines()
    assert count == len(lines) == len(guard.calibration_shapes(load(state.table)))
    assert "2x3584x3584 bf16" in lines  # another model's layer between the tuned Ms


def test_a_shape_served_by_the_baselines_own_call_is_spread_not_a_loss():
    """A cuBLAS or unproven route calls F.linear, the baseline's very call: its 0.96 is the
    method's A/A spread (kept in the summary), while a kernel route at 0.96 is a loss."""
    for path, served_loss in (("cublas", False), ("unproven", False), ("guarded", True), ("bucket", True)):
        rows = _rows(ratio=0.96)
        rows["guard_on"][0] = {**rows["guard_on"][0], "path": path}
        rows["guard_off"][0] = {**rows["guard_off"][0], "path": path}
        summary = guard.summarize(rows)
        on, off = summary["untuned_never_slower"], summary["guard_off_calibrated"]
        assert on["ok"] is off["ok"] is (not served_loss), path
        assert on["below"] == (["3x4096x4096 0.960"] if served_loss else []), path
        assert on["min"] == 0.96  # the measured minimum is still reported
        spread = ({"shapes": 0, "min": None, "max": None} if served_loss
                  else {"shapes": 1, "min": 0.96, "max": 0.96})
        assert on["baseline_call_spread"] == off["baseline_call_spread"] == spread, path
        assert abs(summary["untuned_geomean"]["geomean"] - 0.96 ** (1 / 48) * 1.05 ** (47 / 48)) < 1e-9



def test_fuse_tunes_and_times_the_fused_model():
    """--fuse: the study is the fused model's (study create --fuse) and the hf phase patches
    with fuse=True, so every GEMM the fused model runs is an exact entry."""
    args = mt.parse_args(["--fuse", "--study", "hf_fused"])
    cmds = mt.commands(args, mt.State(Path("unused")), 300)
    assert "--fuse" in cmds["study"] and cmds["study"][cmds["study"].index("create") + 1] == "hf_fused"
    assert cmds["hf"][-1] == "--fuse"
    assert "--fuse" not in mt.commands(mt.parse_args([]), mt.State(Path("unused")), 300)["hf"]
