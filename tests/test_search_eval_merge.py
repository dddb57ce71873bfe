"""search-eval on recordings of one problem merged (a uniform sample and a TPE run of it, as
benchmarks/record_sweeps_h200.py exports them), its convergence plot, and the acceptance figures
of benchmarks/search_eval_recorded.py, on small synthetic sweeps."""
from __future__ import annotations

import importlib.util
import itertools
import json

import pytest

from conftest import REPO, invoke_cli
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.evaluate import method
from tunefw.evaluate.sweepfile import (FORMAT, VERSION, Sweep, SweepRow, merge_sweeps,
                                       problem_filename, read_sweep, write_sweep)
from tunefw.problem import GemmProblem
from tunefw.templates import config_key, get_family
from tunefw.tune.search_eval import run_search, search_eval
from tunefw.tune.space import uniform_order

FAMILY = "stream_sm90"  # a small space (6000 declared): 60 recorded configs are not too sparse
SQUARE, DECODE = GemmProblem(1, 4096, 4096), GemmProblem(16, 4096, 4096)
FP = {"name": "NVIDIA H200", "cc": 90, "sm_count": 132, "driver": "d", "cuda": "c",
      "compiler": "nvrtc", "method": method.METHOD}
VALID = 400_000  # the header's valid-space size (not counted here)


def _ratio(config: dict) -> float:
    """A made-up ratio with structure a sampler can learn: each knob's first values win."""
    params = get_family(FAMILY).params
    return round(1.5 - sum(p.values.index(config[p.name]) for p in params) / 40, 5)


def _sweep(study: str, sampler: str, problem: GemmProblem, configs: list[dict],
           winner_ratio: float | None = None) -> Sweep:
    rows = [SweepRow(FAMILY, c, "OK", _ratio(c), 0.2, 500 * _ratio(c), 500.0) for c in configs]
    best = max(rows, key=lambda r: r.ratio)
    winner = {"family": FAMILY, "config": best.config, "tflops": 1.0, "cublas_tflops": 1.0,
              "ratio": winner_ratio or best.ratio, "confirmed": True, "trial_id": 1}
    header = {"format": FORMAT, "version": VERSION, "study": study, "round": 0,
              "problem": problem.as_dict(), "label": "", "sampler": sampler,
              "space_hashes": {FAMILY: get_family(FAMILY).space_hash()}, "method": method.METHOD,
              "fingerprint": dict(FP, uuid=f"GPU-{study}"), "winner": winner,
              "coverage": {"distinct_measured": len(rows), "valid_space": VALID}}
    return Sweep(header, rows)


def _order(problem: GemmProblem, n: int, seed: int = 0) -> list[dict]:
    return [c for _, c in itertools.islice(uniform_order([FAMILY], problem, H200, seed), n)]


@pytest.fixture
def recorded(tmp_path):
    """records/uniform: 60 configs of each of two problems; records/tpe_s0: 30 of the first
    problem's, half of them the uniform sample's (a reused config), half new."""
    uniform = {p: _order(p, 60) for p in (SQUARE, DECODE)}
    tpe = uniform[SQUARE][:15] + _order(SQUARE, 15, seed=9)
    sweeps = {"uniform": [_sweep("records_uniform", "uniform", p, c) for p, c in uniform.items()],
              "tpe_s0": [_sweep("records_tpe_s0", "tpe", SQUARE, tpe, winner_ratio=9.0)]}
    for sub, items in sweeps.items():
        for sw in items:
            write_sweep(tmp_path / "records" / sub / problem_filename(sw.problem), sw)
    return tmp_path / "records", uniform, tpe


def test_merged_recordings_hold_the_union_and_the_best_confirmed_winner(recorded):
    root, uniform, tpe = recorded
    parts = [read_sweep(root / sub / problem_filename(SQUARE)) for sub in ("uniform", "tpe_s0")]
    merged = merge_sweeps(parts)
    union = {config_key(FAMILY, c) for c in uniform[SQUARE] + tpe}
    assert set(merged.by_key()) == union and len(merged.rows) == 90
    assert merged.header["study"] == "records" and merged.header["sampler"] == "tpe+uniform"
    assert merged.header["winner"]["ratio"] == 9.0  # the better confirmation of the two
    assert merged.header["coverage"] == {"distinct_measured": len(union), "valid_space": VALID,
                                         "fraction": round(len(union) / VALID, 5)}
    assert merged.header["merged_from"] == [str(p.path) for p in parts]
    other = read_sweep(root / "uniform" / problem_filename(DECODE))
    with pytest.raises(UserError, match="another problem"):
        merge_sweeps([parts[0], other])
    parts[1].header["method"] = "anchored-1"
    with pytest.raises(UserError, match="another method"):
        merge_sweeps(parts)


def test_search_eval_merges_one_problem_s_recordings(recorded):
    root, uniform, tpe = recorded
    merged = search_eval([str(root)], ["random", "grid"], 3, [8, 16], merge=True)
    apart = search_eval([str(root)], ["grid"], 1, [8, 16])
    assert [e["space"] for e in apart["sweeps"]] == [30, 60, 60]  # each file alone
    by_problem = {e["problem"]: e for e in merged["sweeps"]}
    square = by_problem[SQUARE.key()]
    assert merged["merged"] and len(merged["sweeps"]) == 2
    assert square["space"] == len({config_key(FAMILY, c) for c in uniform[SQUARE] + tpe})
    assert len(square["merged_from"]) == 2 and by_problem[DECODE.key()]["merged_from"] is None
    for s in square["samplers"].values():
        curve = s["median_best_curve"]
        assert len(curve) == 16 and all(a <= b for a, b in zip(curve, curve[1:]))
        assert curve[7] == s["median_best_at"]["8"] and curve[15] == s["median_best_at"]["16"]
    sweep = merge_sweeps([read_sweep(root / sub / problem_filename(SQUARE))
                          for sub in ("uniform", "tpe_s0")])
    assert run_search(sweep, "grid", 0, 200).best_at(200) == sweep.best_ratio()


def test_search_eval_cli_merges_and_plots(recorded, tmp_path):
    root, _, _ = recorded
    out, plot = tmp_path / "r.json", tmp_path / "c.png"
    done = invoke_cli("search-eval", str(root), "--merge", "--samplers", "tpe,random",
                      "--seeds", "2", "--budgets", "4,8", "--out", str(out), "--plot", str(plot),
                      "--jobs", "2")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["merged"] and [len(e["samplers"]["tpe"]["median_best_curve"])
                                 for e in result["sweeps"]] == [8, 8]
    alone = search_eval([str(root)], ["tpe", "random"], 2, [4, 8], merge=True)
    assert alone["sweeps"] == result["sweeps"]  # two processes ran the same searches
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _script():
    path = REPO / "benchmarks" / "search_eval_recorded.py"
    spec = importlib.util.spec_from_file_location("search_eval_recorded", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_searches_the_full_sweeps_and_judges_the_acceptance(recorded, tmp_path):
    root, _, _ = recorded
    out = tmp_path / "search_eval.json"
    assert _script().main(["--sources", "records", "--records", str(root), "--seeds", "2",
                           "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["sources"] == {"records": ["tpe", "random", "uniform", "grid"]}
    assert result["merged"] == {"records": True} and len(result["sweeps"]) == 2
    acc = result["acceptance"]
    assert {r["problem"] for r in acc["sweeps"]} == {SQUARE.key(), DECODE.key()}
    for row, entry in zip(acc["sweeps"], result["sweeps"]):
        t2 = entry["samplers"]["tpe"]["median_trials_to"]["2%"]
        assert row["tpe_trials_to_2pct"] == t2 and row["valid_space"] == VALID
        assert row["within_10pct_of_valid"] == (t2 is not None and t2 <= VALID / 10)
    assert (tmp_path / "search_eval.png").read_bytes()[:4] == b"\x89PNG"
    assert "full recorded sweeps" in result["limits"]


def test_acceptance_needs_every_sweep_and_four_of_five_at_64():
    def entry(t2: float | None, r2: float | None, at64: float) -> dict:
        return {"problem": "p", "label": "", "space": 2400, "reference_ratio": 1.0,
                "coverage": {"valid_space": 1000}, "samplers": {
                    "tpe": {"median_trials_to": {"2%": t2}, "median_best_at": {"64": at64}},
                    "random": {"median_trials_to": {"2%": r2}}}}
    script = _script()
    good = [entry(10, 20, 0.99)] * 4 + [entry(30, None, 0.9)]
    assert script.acceptance({"sweeps": good})["pass"]
    assert not script.acceptance({"sweeps": good[:3] + [entry(30, None, 0.9)] * 2})["pass"]
    assert not script.acceptance({"sweeps": good[:4] + [entry(20, 20, 0.99)]})["pass"]
    assert not script.acceptance({"sweeps": good[:4] + [entry(101, None, 0.99)]})["pass"]
    # both samplers at the first trial (the seeds found it): a tie no sampler can beat
    tied = script.acceptance({"sweeps": good[:4] + [entry(1, 1, 0.99)]})
    assert tied["pass"] and tied["sweeps"][-1]["tied_at_first_trial"]
    assert not tied["sweeps"][-1]["fewer_than_random"]
    assert not script.acceptance({"sweeps": good[:4] + [entry(2, 2, 0.99)]})["pass"]
    # where uniform random search ran, it is the baseline: tunefw's random sampler asks the
    # seed configs first as TPE does, so a tie with it at the seeds is no verdict on the search
    tie = entry(5, 5, 0.99)
    tie["samplers"]["uniform"] = {"median_trials_to": {"2%": 40}}
    judged = script.acceptance({"sweeps": good[:4] + [tie]})
    assert judged["pass"] and judged["sweeps"][-1]["baseline"] == "uniform"
    assert judged["sweeps"][-1]["fewer_than_baseline"] and not judged["sweeps"][-1]["fewer_than_random"]
    tie["samplers"]["uniform"] = {"median_trials_to": {"2%": 5}}
    assert not script.acceptance({"sweeps": good[:4] + [tie]})["pass"]
    # the budget that gets within 2% on four of five, and on all, by the median runs
    budgets = script.acceptance({"sweeps": good})
    assert (budgets["budget_within_2pct_on_most"], budgets["budget_within_2pct_on_all"]) == (10, 30)


def test_the_readme_names_the_budget_the_committed_records_support():
    """Issue 17: where the 64-trial default does not reach within 2% on four of five recorded
    sweeps, the README says what budget does: the committed result's figures, in bold."""
    acc = json.loads((REPO / "benchmarks/results/search_eval.json").read_text())["acceptance"]
    assert acc["search_pass"] and len(acc["sweeps"]) == 5
    if acc["within_2pct_at_64"] < 4:
        readme = " ".join((REPO / "README.md").read_text().split())
        assert (f"**{acc['budget_within_2pct_on_most']} trials reach it on four of five and "
                f"{acc['budget_within_2pct_on_all']} on all five**") in readme
