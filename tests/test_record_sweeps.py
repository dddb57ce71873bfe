"""benchmarks/record_sweeps_h200.py on the simulated device (the CPU side of its device run):
its studies, two calls that resume one another without measuring a config twice, and the
exported sweeps and summary, row for row against the state database."""
from __future__ import annotations

import importlib.util
import itertools
import json
import lzma
import sqlite3
import sys
import tarfile

import pytest

from conftest import REPO
from tunefw.device import H200
from tunefw.evaluate import method
from tunefw.evaluate.sweepfile import read_sweep
from tunefw.problem import GemmProblem
from tunefw.templates import config_key
from tunefw.tune.space import uniform_order

spec = importlib.util.spec_from_file_location("record_sweeps_h200",
                                              REPO / "benchmarks" / "record_sweeps_h200.py")
script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = script  # its dataclass looks itself up there
spec.loader.exec_module(script)

STUDY = """name: small
families: [stream_sm90]
timeout_s: 30
confirm_top: 2
problems:
  - {shape: 1x4096x4096, label: m1}
  - {shape: 16x4096x4096, label: m16}
sim:
  trial_seconds: 0.3
"""
PROBLEMS = [GemmProblem(1, 4096, 4096), GemmProblem(16, 4096, 4096)]
SAMPLE = ["--backend", "sim", "--gpus", "2", "--uniform", "5", "--tpe-trials", "6",
          "--tpe-seeds", "0", "--commit", "abc123"]


def test_the_default_plan_is_three_tpe_seeds_then_a_uniform_sample_of_2000():
    parts = script.plan(2000, 160, [0, 1, 2])
    assert [(p.study, p.subdir, p.sampler, p.seed, p.trials) for p in parts] == [
        ("records_tpe_s0", "tpe_s0", "tpe", 0, 160), ("records_tpe_s1", "tpe_s1", "tpe", 1, 160),
        ("records_tpe_s2", "tpe_s2", "tpe", 2, 160),
        ("records_uniform", "uniform", "uniform", 0, 2000)]
    problems = script.load_study_file(script.STUDY_FILE).problems
    assert [p.key() for p in problems] == [
        "4096x4096x4096:bf16:TN", "8192x28672x4096:bf16:TN", "128x6144x4096:bf16:TN",
        "16x4096x4096:bf16:TN", "257x4096x4096:bf16:TN"]


def _db_rows(state, study: str) -> dict[str, list[tuple]]:
    """Per problem key, the study's rows (config key, status, ratio) from the packed state."""
    raw = state.parent / "unpacked.db"
    raw.write_bytes(lzma.decompress((state / script.PACKED).read_bytes()))
    con = sqlite3.connect(raw)
    try:
        rows = con.execute(
            "select p.key, t.config_key, t.status, t.tflops, t.cublas_tflops from tunefw_trial t "
            "join tunefw_problem p on p.id = t.problem_id join tunefw_study s on s.id = t.study_id "
            "where s.name = ? order by t.id", (study,)).fetchall()
        ids = dict(con.execute("select p.key, p.id from tunefw_problem p join tunefw_study s on "
                               "s.id = p.study_id where s.name = ?", (study,)).fetchall())
    finally:
        con.close()
    out: dict[str, list[tuple]] = {}
    for key, *rest in rows:
        out.setdefault(key, []).append(tuple(rest))
    return out, ids


def test_two_calls_record_resume_and_export(tmp_path, monkeypatch, ray_head):
    for name, value in ray_head.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(script, "LAUNCH_OVERHEAD_S", 0.0)
    monkeypatch.setattr(script, "MIN_LAUNCH_S", 0.0)
    study_file = tmp_path / "small.yaml"
    study_file.write_text(STUDY)
    state, out = tmp_path / "state", tmp_path / "out"
    common = SAMPLE + ["--study-file", str(study_file), "--state", str(state),
                       "--address", ray_head.address]
    # call 1: only the first study, its launch stopped by a 1 s time limit (likely midway)
    monkeypatch.setattr(script, "LAUNCH_OVERHEAD_S", 99.0)
    assert script.main(common + ["--budget-s", "100", "--only", "tpe_s0",
                                 "--out", str(state)]) == 3
    monkeypatch.setattr(script, "LAUNCH_OVERHEAD_S", 0.0)
    first = json.loads((state / script.CALLS).read_text())
    assert [c["call"] for c in first] == [1] and not first[0]["complete"]
    assert [launch["study"] for launch in first[0]["launches"]] == ["records_tpe_s0"]
    assert first[0]["launches"][0]["time_limit_s"] == 1
    assert first[0]["launches"][0]["evaluated_after"] <= 12
    # call 2: the device's way, results into a folder of their own
    assert script.main(common + ["--budget-s", "600", "--out", str(out)]) == 0
    calls = json.loads((out / script.CALLS).read_text())
    done_before = first[0]["launches"][0]["evaluated_after"] == 12
    assert [launch["study"] for launch in calls[1]["launches"]] == (
        [] if done_before else ["records_tpe_s0"]) + ["records_uniform"]
    assert calls[1]["complete"] and calls[1]["commit"] == "abc123"
    with tarfile.open(out / "sweeps_wgmma_sm90_h200.tar") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    budgets = {"records_tpe_s0": 6, "records_uniform": 5}
    for study, budget in budgets.items():
        rows, ids = _db_rows(out, study)
        for problem in PROBLEMS:
            mine = rows[problem.key()]
            evaluated = [r for r in mine if r[1] != "INVALID"]
            assert len(evaluated) == budget == len({r[0] for r in evaluated})  # none twice
            sweep = read_sweep(tmp_path / "x" / "wgmma_sm90_h200" / study[8:]
                               / f"{problem.M}x{problem.N}x{problem.K}_bf16_TN.jsonl.gz")
            assert [(r.key, r.outcome, r.tflops) for r in sweep.rows] == [
                (k, s, None if t is None else float(f"{t:.6g}")) for k, s, t, _ in mine]
            assert sweep.header["study"] == study and sweep.header["method"] == method.METHOD
            if study == "records_uniform":  # the first valid configs of its seeded order
                order = uniform_order(["stream_sm90"], problem, H200, 0 + ids[problem.key()])
                assert [r[0] for r in mine] == [config_key(f, c)
                                                for f, c in itertools.islice(order, budget)]
    result = json.loads((out / script.RESULT).read_text())
    assert result["commit"] == "abc123" and len(result["calls"]) == 2
    assert result["device"]["name"] == "SIMULATED NVIDIA H200" and not result["issue_sample_met"]
    assert result["totals"]["evaluated"] == 2 * sum(budgets.values())
    assert result["sweeps"]["files"] == 4
    for shape in result["shapes"]:
        assert {n: p["evaluated"] for n, p in shape["parts"].items()} == budgets
        assert shape["valid_space"] > 1000 and shape["union"]["best_confirmed_ratio"]
    # the state re-exported (as on the CPU afterwards): the same summary
    again = tmp_path / "again"
    assert script.main(common + ["--state", str(out), "--out", str(again), "--export-only"]) == 0
    assert json.loads((again / script.RESULT).read_text())["shapes"] == result["shapes"]


def test_a_state_made_with_other_options_is_refused(tmp_path, monkeypatch):
    study_file = tmp_path / "small.yaml"
    study_file.write_text(STUDY)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    part = script.plan(5, 6, [0])[0]
    script.ensure_study(db, part, study_file, None, tmp_path / "log")
    with pytest.raises(SystemExit, match="sampler tpe, seed 0, 6 trials, not tpe, 0, 7"):
        script.ensure_study(db, script.plan(5, 7, [0])[0], study_file, None, tmp_path / "log")


def _pinned(tmp_path, families: list[str]) -> tuple[dict, dict, str]:
    """The committed pinned tree's kernel source and space hashes (per family) and method."""
    import subprocess

    tree = tmp_path / "tree"
    with tarfile.open(REPO / "benchmarks" / "state" / "tree.tar.gz") as tar:
        tar.extractall(tree, filter="data")
    assert len((tree / "COMMIT").read_text().strip()) == 40
    code = ("import json, sys; from tunefw.templates import get_family; "
            "from tunefw.evaluate.method_id import METHOD; fs = sys.argv[1:]; "
            "print(json.dumps([{f: get_family(f).source_hash() for f in fs}, "
            "{f: get_family(f).space_hash() for f in fs}, METHOD]))")
    return tuple(json.loads(subprocess.run(
        [sys.executable, "-c", code, *families], cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True).stdout))


def _measured(db: str) -> tuple[dict, dict, set]:
    """A state database's trial sources in each study's current round and its study spaces
    (family -> set) and methods."""
    con = sqlite3.connect(db)
    sources, spaces = {}, {}
    for family, source in con.execute(
            "SELECT DISTINCT t.family, t.source_hash FROM tunefw_trial t JOIN tunefw_study s "
            "ON s.id = t.study_id WHERE t.round = s.round"):
        sources.setdefault(family, set()).add(source)
    for (hashes,) in con.execute("SELECT space_hashes FROM tunefw_study"):
        for family, space in json.loads(hashes).items():
            spaces.setdefault(family, set()).add(space)
    methods = {json.loads(f)["method"] for (f,) in con.execute(
        "SELECT fingerprint FROM tunefw_study")}
    con.close()
    return sources, spaces, methods


def test_the_pinned_tree_measures_what_the_resumed_study_measured(tmp_path):
    """benchmarks/pinned_tree.sh runs the llama3_8b table from benchmarks/state/tree.tar.gz: its
    kernel sources, parameter spaces and timing method are those of the study's current round,
    so its launches resume (main may move on). The recording is complete (every part of the
    committed result confirmed) and resumes no more: it needs no pinned tree."""
    state = REPO / "benchmarks" / "state"
    recorded = json.loads((REPO / "benchmarks" / "results" / "record_sweeps_h200.json").read_text())
    assert recorded["issue_sample_met"] and all(
        part.get("confirmed") for shape in recorded["shapes"] for part in shape["parts"].values())
    with tarfile.open(state / "llama3_8b_state.tar.gz") as tar:
        tar.extractall(tmp_path / "llama", filter="data")
    sources, spaces, methods = _measured(str(tmp_path / "llama" / "state.db"))
    pinned_sources, pinned_spaces, method = _pinned(tmp_path, sorted(sources))
    assert sources == {f: {h} for f, h in pinned_sources.items()}
    assert spaces == {f: {pinned_spaces[f]} for f in spaces} and methods == {method}


def test_the_committed_state_figures_are_what_the_committed_states_give(tmp_path):
    """benchmarks/results/state_figures_h200.json (the figures the notes and README quote from
    the states: the llama3_8b search, the recording's disturbed anchors) is regenerated from the
    committed states by its script, byte for byte."""
    spec = importlib.util.spec_from_file_location("state_figures",
                                                  REPO / "benchmarks" / "state_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    assert figures.main(["--out", str(tmp_path / "f.json")]) == 0
    committed = REPO / "benchmarks" / "results" / "state_figures_h200.json"
    assert (tmp_path / "f.json").read_text() == committed.read_text()
    records = json.loads(committed.read_text())["records"]
    assert records["disturbed"] == len(records["rows"]) > 0
    assert all(r["cublas_rate_of_median"] < records["anchor_below"] for r in records["rows"])
