"""The listing commands as a user reads them: `trial list`, `trial show`, `study show`,
`study list` and `status`, each as text and as --json (the same data), on rows written through
the store (conftest.seed_study: per problem an INVALID row, OK trials at 100/120/130/140 TFLOP/s
of cuBLAS's 150, one WRONG_ANSWER, the best confirmed)."""
from __future__ import annotations

import json

import pytest

from conftest import db_dump, invoke_cli, one_line_error, seed_study
from tunefw.cli.render import knobs
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.store.models import Trial, Winner

SHAPES = ("1024x1024x1024", "128x6144x4096")


@pytest.fixture
def seeded(db_url: str) -> list[int]:
    """Study 'v': problem 0 labelled llama.qkv, its winner confirmed at 165 TFLOP/s (1.1x, its
    trial screened 0.933x) and its winning trial's ptxas figures stored; problem 1's winner as
    screened. Trial ids: 1 INVALID, 2 OK, 3 WRONG_ANSWER, 4-6 OK; 7-12 likewise."""
    winners = seed_study(db_url, "v", SHAPES, trials=5)
    store = open_store(db_url)
    with store.session() as s:
        study = q.get_study(s, "v")
        problem = study.problems[0]
        problem.label = "llama.qkv"
        best = s.get(Trial, winners[0])
        best.ptxas_regs, best.ptxas_smem_bytes, best.ptxas_spill_bytes = 154, 1024, 0
        q.set_winner(s, problem, best, 165.0, 150.0, confirmed=True)
    store.close()
    return winners


def _json(db_url: str, *args: str):
    result = invoke_cli(*args, "--json", db=db_url)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _line(stdout: str, needle: str) -> str:
    (line,) = [line for line in stdout.splitlines() if needle in line]
    return line


def test_trial_list_one_row_per_trial_with_filters_and_top(db_url, seeded):
    listed = _json(db_url, "trial", "list", "v")
    assert (listed["study"], listed["round"], listed["kind"]) == ("v", 0, "SIMULATED")
    rows = listed["trials"]
    assert [r["id"] for r in rows] == list(range(1, 13))
    assert [r["outcome"] for r in rows[:6]] == ["INVALID", "OK", "WRONG_ANSWER", "OK", "OK", "OK"]
    assert {(r["problem"]["M"], r["label"]) for r in rows} == {(1024, "llama.qkv"), (128, "")}
    assert [r["tflops"] for r in rows[:6]] == [None, 100.0, None, 120.0, 130.0, 140.0]
    assert rows[5]["ratio"] == pytest.approx(140 / 150) and rows[2]["ratio"] is None
    assert [r["id"] for r in _json(db_url, "trial", "list", "v", "--problem",
                                   "128x6144x4096")["trials"]] == list(range(7, 13))
    assert [r["id"] for r in _json(db_url, "trial", "list", "v", "--outcome",
                                   "wrong_answer")["trials"]] == [3, 9]
    # best first by ratio, ties by id; trials without a ratio never outrank one
    assert [r["id"] for r in _json(db_url, "trial", "list", "v", "--top", "5")["trials"]] == [
        6, 12, 5, 11, 4]
    text = invoke_cli("trial", "list", "v", "--top", "1", db=db_url)
    assert text.returncode == 0, text.stderr
    assert "study v round 0: 1 trial(s), best first [SIMULATED]" in text.stdout
    cells = [c.strip() for c in _line(text.stdout, "llama.qkv").split("│")[1:-1]]
    assert cells == ["6", "1024x1024x1024 bf16", "llama.qkv", "mma_sm80", "OK", "0.933x",
                     "140.0", knobs("mma_sm80", rows[5]["config"])]
    assert cells[-1].startswith("BM=") and " BN=" in cells[-1]


@pytest.mark.parametrize("args, needle", [
    (("--outcome", "MAYBE"), "--outcome 'MAYBE': expected one of OK, INVALID"),
    (("--top", "0"), "--top 0: expected at least 1"),
    (("--problem", "64x64x64"), "--problem 64x64x64: study 'v' has no such problem"),
    (("--problem", "big"), "shape 'big': expected MxNxK"),
])
def test_trial_list_bad_input_is_one_line(db_url, seeded, args, needle):
    before = db_dump(db_url)
    result = invoke_cli("trial", "list", "v", *args, db=db_url)
    one_line_error(result.returncode, result.stderr, needle)
    assert db_dump(db_url) == before


def test_trial_show_names_the_shape_the_layer_and_ptxas(db_url, seeded):
    shown = invoke_cli("trial", "show", "6", db=db_url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "trial 6 of study v: 1024x1024x1024 bf16 TN, layer llama.qkv"
    assert lines[1] == "ptxas: 154 registers/thread, 1024 B static shared memory, 0 B spilled"
    data = _json(db_url, "trial", "show", "6")
    assert (data["study"], data["label"]) == ("v", "llama.qkv")
    assert data["problem"] == {"M": 1024, "N": 1024, "K": 1024, "dtype": "bf16", "layout": "TN",
                               "gate": "none"}
    assert (data["ptxas_regs"], data["ptxas_smem_bytes"], data["ptxas_spill_bytes"]) == (
        154, 1024, 0)
    unlabelled = invoke_cli("trial", "show", "9", db=db_url).stdout.splitlines()
    assert unlabelled[:2] == ["trial 9 of study v: 128x6144x4096 bf16 TN",
                              "ptxas: - (nothing compiled)"]


def test_study_show_best_knobs_confirmed_and_screened(db_url, seeded):
    store = open_store(db_url)
    with store.session() as s:  # problem 1 without a confirmation: its best as screened
        s.delete(s.get(Winner, q.get_study(s, "v").problems[1].id))
    store.close()
    shown = invoke_cli("study", "show", "v", db=db_url)
    assert shown.returncode == 0, shown.stderr
    assert "study v round 0 (SIMULATED)" in shown.stdout
    first = [c.strip() for c in _line(shown.stdout, "1024x1024x1024").split("│")[1:-1]]
    second = [c.strip() for c in _line(shown.stdout, "128x6144x4096").split("│")[1:-1]]
    data = _json(db_url, "study", "show", "v")
    one, two = data["problems"]
    assert first[:2] == ["1024x1024x1024 bf16", "llama.qkv"] and second[1] == "-"
    assert first[5:8] == ["1.100x confirmed (screened 0.933x)", "165.0", "150.0"]
    assert second[5:7] == ["0.933x screened", "140.0"]
    assert first[9] == knobs("mma_sm80", one["best"]["config"]) == second[9]
    assert (first[10], first[11], second[11]) == ("6", "kernel", "cuBLAS (loses)")
    # --json: the same figures
    assert (one["label"], data["kind"]) == ("llama.qkv", "SIMULATED")
    assert one["best"]["ratio"] == pytest.approx(1.1) and one["best"]["confirmed"] is True
    assert one["best"]["screen_ratio"] == pytest.approx(140 / 150)
    assert (one["best"]["tflops"], one["best"]["screen_tflops"]) == (165.0, 140.0)
    assert (one["best"]["ptxas_regs"], one["best"]["ptxas_smem_bytes"]) == (154, 1024)
    assert two["best"]["confirmed"] is False and two["best"]["trial_id"] == 12
    assert two["best"]["ratio"] == two["best"]["screen_ratio"] == pytest.approx(140 / 150)


def test_study_list_and_status_as_json(db_url, seeded):
    (listed,) = _json(db_url, "study", "list")
    assert {k: listed[k] for k in ("name", "problems", "evaluated", "ok", "round", "backend")} \
        == {"name": "v", "problems": 2, "evaluated": 10, "ok": 8, "round": 0, "backend": "sim"}
    (status,) = _json(db_url, "status")
    assert {k: status[k] for k in ("name", "evaluated", "target", "state", "kind")} == {
        "name": "v", "evaluated": 10, "target": 10, "state": "done", "kind": "SIMULATED"}
    assert [(e["id"], e["status"], e["first_line"]) for e in status["errors"]] == [
        (9, "WRONG_ANSWER", "1 rows over their limit"), (3, "WRONG_ANSWER",
                                                         "1 rows over their limit")]
    text = invoke_cli("status", db=db_url).stdout
    assert "v round 0: 10/10 evaluated, done" in text and "trial 9 WRONG_ANSWER" in text


def test_status_figures_say_simulated(db_url, seeded):
    store = open_store(db_url)
    with store.session() as s:
        q.get_study(s, "v").stats = {
            "simulated": True, "trials": 10, "wall_s": 2.0, "trials_per_s": 5.0,
            "gpu_busy_mean": 0.5, "first_trial_s": 1.25, "gpu_busy": {"0": 0.5},
            "trials_per_s_per_gpu": {"0": 5.0}, "starved_s": {"ask": 1.0}, "asks": 12,
            "ask_s": 0.5}
    store.close()
    text = invoke_cli("status", db=db_url).stdout.splitlines()
    figures = [line for line in text if any(c.isdigit() for c in line) and "trial 9" not in line
               and "trial 3" not in line and "evaluated" not in line]
    assert figures == [
        "  last launch: 10 trials in 2.0 s (5.00/s), GPU busy 50%, first trial 1.2 s after "
        "launch [SIMULATED]",
        "  worker GPU 0: 5.00 trials/s, busy 50% [SIMULATED]",
        "  GPU idle, waiting on: ask 1.0 s (sampler: 12 asks in 0.5 s) [SIMULATED]"]
    shown = invoke_cli("study", "show", "v", db=db_url).stdout
    assert "last launch: 10 trials in 2.0 s (5.00/s), GPU busy 50%, first trial 1.2 s after " \
        "launch [SIMULATED]" in shown
