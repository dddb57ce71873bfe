"""What `tunefw launch` prints: a start-up summary (backend, GPU workers, trials budget before
any worker starts; each family's declared and valid space, counted while the workers start),
progress lines that say which best is screened and which confirmed and mark every figure
SIMULATED or REPLAY, and the seconds from the command to its workers up and its first finished
trial, stored with the launch's figures and shown by study show.

The launches run in this process on tests/fakepool.py's pool (no Ray): the sweep itself is
tested in test_sweep_pipeline.py, the real Ray launch in test_launch_sim.py."""
from __future__ import annotations

import io
import json
import sqlite3
import sys
import threading

import pytest
from rich.console import Console

import tunefw.tune.interrupt
import tunefw.tune.search
import tunefw.tune.space
import tunefw.tune.sweep
from conftest import db_dump, db_rows, invoke_cli
from fakepool import FakePool
from tunefw.cli.progress import LaunchProgress
from tunefw.cli.render import startup_figures
from tunefw.cli.startup import startup_lines
from tunefw.device import H200
from tunefw.study.spec import parse_study
from tunefw.templates import FAMILIES
from tunefw.tune.space import CHECKS_BUDGET, declared_size

SHAPES = ("4096x4096x4096", "16x28672x4096")


@pytest.fixture
def fake_ray(monkeypatch):
    """Launches get a FakePool of --gpus workers. Asked for the pool, it waits (up to 30 s) for
    the summary's space estimate, which the launch counts and prints in a thread of its own
    while the workers start; what stdout held then is kept, with whether the estimate was
    printed (the event is set once the "starting" hook has printed it, not when it is counted:
    the lines are printed after space_lines returns)."""
    seen: list[tuple[str, bool]] = []
    counted = threading.Event()
    hook = LaunchProgress.hook

    def printed(self, event, data):
        hook(self, event, data)
        if event == "starting":
            counted.set()

    def pool(options, spec, replay):
        done = counted.wait(30)
        sys.stdout.flush()
        seen.append((sys.stdout.buffer.getvalue().decode(), done))
        counted.clear()
        return FakePool(workers=options.gpus)

    monkeypatch.setattr(tunefw.tune.sweep, "ray_pool", pool)
    monkeypatch.setattr(LaunchProgress, "hook", printed)
    monkeypatch.setattr(tunefw.tune.interrupt, "stop_on_sigterm", lambda: None)
    return seen


def _launch(db_url: str) -> str:
    made = invoke_cli("study", "create", "s", *(a for s in SHAPES for a in ("--shape", s)),
                      "--trials", "3", "--sampler", "random", "--confirm-top", "2", db=db_url)
    assert made.returncode == 0, made.stderr
    launched = invoke_cli("launch", "s", "--gpus", "2", "--backend", "sim", db=db_url)
    assert launched.returncode == 0, launched.stderr
    return launched.stdout


def test_the_summary_comes_first_and_is_counted_while_the_workers_start(db_url, fake_ray):
    stdout = _launch(db_url)
    ((while_starting, counted),) = fake_ray
    assert counted  # the space estimate ran beside the pool's start, not before or after it
    summary = while_starting.splitlines()
    assert summary[0] == ("launch s: backend sim (SIMULATED device), 2 GPU worker(s), 2 "
                          "problem(s) x 3 trials = 6 trials budget (sampler random, confirm "
                          "top 2)")
    assert stdout.startswith(while_starting)
    assert stdout.splitlines()[len(summary)].startswith("launch s on 2 worker(s)")
    families = {line.split(":")[0].strip(): line for line in summary[1:] if "declared" in line}
    assert sorted(families) == sorted(FAMILIES)
    for name, line in families.items():
        assert f"  {name}: {declared_size(name):,} configs declared; valid on NVIDIA H200 " \
               "[SIMULATED]: " in line
    # with five families and two problems every space is past its share of the checks budget:
    # estimated, marked "~" (space_sizes counts exactly within the share: test_space_sizes)
    assert all(declared_size(n) > CHECKS_BUDGET // (len(FAMILIES) * 2) for n in FAMILIES)
    assert families["stream_sm90"].endswith("none for 4096x4096x4096, ~4.13k for 16x28672x4096")
    assert "~" in families["wgmma_sm90"] and "estimated from" in summary[-1]


def test_every_figure_says_simulated_and_which_best_it_is(db_url, fake_ray):
    stdout = _launch(db_url)
    lines = stdout.splitlines()
    trials = [line for line in lines if line.startswith("trial ")]
    assert len(trials) == 6 and all(line.endswith(" [SIMULATED]") for line in trials)
    figures = [line for line in lines if "TFLOP/s" in line or "x cuBLAS" in line]
    assert figures and all("SIMULATED" in line for line in figures)
    bars = [line for line in lines if "3/3" in line]
    assert len(bars) == 2 and all("SIMULATED" in b and "screened best" in b for b in bars)
    shown = json.loads(invoke_cli("study", "show", "s", "--json", db=db_url).stdout)
    for p in shown["problems"]:
        key = f"{p['M']}x{p['N']}x{p['K']}:bf16:TN"
        best = p["best"]
        screened = ("" if f"{best['screen_ratio']:.3f}" == f"{best['ratio']:.3f}"
                    else f" (screened {best['screen_ratio']:.3f}x)")
        assert (f"{key}: confirmed best {best['ratio']:.3f}x cuBLAS, {best['tflops']:.1f} "
                f"TFLOP/s, trial {best['trial_id']}{screened} [SIMULATED]") in lines


def test_the_start_up_is_stored_and_shown(db_url, fake_ray):
    """The seconds from the command to its workers up and to its first finished trial."""
    stdout = _launch(db_url)
    stats = json.loads(invoke_cli("study", "show", "s", "--json", db=db_url).stdout)["stats"]
    first, up, every = stats["first_trial_s"], stats["first_worker_s"], stats["workers_up_s"]
    assert isinstance(first, float) and 0 < up <= first
    assert every == up  # the in-process pool's workers are up together
    startup = f"workers up {up:.1f} s, first trial {first:.1f} s after launch"
    end = [line for line in stdout.splitlines() if line.startswith("study s: 6 trials")]
    assert len(end) == 1 and end[0].endswith(f", {startup} [SIMULATED]")
    shown = invoke_cli("study", "show", "s", db=db_url).stdout
    assert (f"last launch: 6 trials in {stats['wall_s']:.1f} s ({stats['trials_per_s']:.2f}/s), "
            f"GPU busy {stats['gpu_busy_mean']:.0%}, {startup} [SIMULATED]") in shown


def test_rejected_configs_are_counted_and_said_to_take_trial_ids(db_url, fake_ray, monkeypatch):
    """Configs the checks refuse are rows with ids of their own: the launch says how many, so
    the ids its trial lines skip are accounted for. Each search's first two proposals are
    made to fail their check here (the screened samplers rarely propose such configs)."""
    asked: dict[int, int] = {}
    ask = tunefw.tune.search.ProblemSearch.ask

    def refusing_first_two(search, known):
        prop = ask(search, known)
        asked[id(search)] = asked.get(id(search), 0) + 1
        if prop is not None and asked[id(search)] <= 2:
            prop.invalid_reason = "refused by the test"
        return prop

    monkeypatch.setattr(tunefw.tune.search.ProblemSearch, "ask", refusing_first_two)
    stdout = _launch(db_url)
    stats = json.loads(invoke_cli("study", "show", "s", "--json", db=db_url).stdout)["stats"]
    ((invalid,),) = db_rows(db_url, "SELECT count(*) FROM tunefw_trial WHERE status='INVALID'")
    assert stats["rejected"] == invalid == 4  # two per problem
    assert (f"{invalid} config(s) rejected without running (INVALID: refused by the family's "
            "checks; NOT_RECORDED under replay): stored as rows of their own, with trial ids, "
            "counted in no budget") in stdout.splitlines()


@pytest.mark.parametrize("stats, said", [
    ({"first_worker_s": 2.04, "workers_up_s": 5.51, "first_trial_s": 2.9},
     "workers up 2.0-5.5 s, first trial 2.9 s after launch"),
    ({"first_worker_s": 2.04, "workers_up_s": None, "first_trial_s": 2.9},  # one never up
     "first worker up 2.0 s, first trial 2.9 s after launch"),
    ({"first_trial_s": 2.9}, "first trial 2.9 s after launch"),  # stored by an older launch
    ({}, ""),
])
def test_start_up_figures_in_words(stats, said):
    assert startup_figures(stats) == said


def test_a_finished_study_is_said_so_before_any_worker_starts(db_url, fake_ray):
    _launch(db_url)
    before = db_dump(db_url)
    again = invoke_cli("launch", "s", "--gpus", "2", "--backend", "sim", db=db_url)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "study s: nothing left to run (every problem has its budget and its confirmed winner); "
        "--new-round starts a new round"]
    assert len(fake_ray) == 1 and db_dump(db_url) == before  # no workers asked for, no rows
    # a winner lost (a launch stopped in its confirmation): the launch starts and confirms
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    con.execute("DELETE FROM tunefw_winner WHERE problem_id = (SELECT min(id) FROM "
                "tunefw_problem)")
    con.commit()
    con.close()
    confirmed = invoke_cli("launch", "s", "--gpus", "2", "--backend", "sim", db=db_url)
    assert confirmed.returncode == 0, confirmed.stderr
    assert len(fake_ray) == 2 and "confirming" in confirmed.stdout
    assert db_rows(db_url, "SELECT count(*) FROM tunefw_winner") == [(2,)]
    new_round = invoke_cli("launch", "s", "--gpus", "2", "--backend", "sim", "--new-round",
                           db=db_url)
    assert new_round.returncode == 0, new_round.stderr
    assert len(fake_ray) == 3 and db_rows(db_url, "SELECT round FROM tunefw_study") == [(1,)]


def _progress(spaces_for=None) -> tuple[LaunchProgress, io.StringIO]:
    text = io.StringIO()
    return LaunchProgress(Console(file=text, width=300), spaces_for), text


def test_replay_lines_say_replay():
    progress, text = _progress()
    row = {"id": 1, "key": "64x64x64:bf16:TN", "evaluated": 1, "budget": 2, "best": 1.25,
           "done": False}
    with progress:
        progress.hook("start", {"study": "r", "backend": "replay", "device": "REPLAY NVIDIA H200",
                                "workers": ["0"], "problems": [row]})
        progress.hook("trial", {"problem": row, "trial_id": 3, "status": "OK", "tflops": 12.5,
                                "ratio": 1.25, "gpu": "0"})
        progress.hook("confirmed", {"winners": [{"key": row["key"], "trial_id": 3, "ratio": 1.2,
                                                 "tflops": 12.0, "screen_ratio": 1.25}]})
    lines = text.getvalue().splitlines()
    assert "trial 3 64x64x64:bf16:TN OK 12.5 TFLOP/s 1.250x cuBLAS gpu 0 [REPLAY]" in lines
    assert ("64x64x64:bf16:TN: confirmed best 1.200x cuBLAS, 12.0 TFLOP/s, trial 3 (screened "
            "1.250x) [REPLAY]") in lines
    assert any("64x64x64:bf16:TN REPLAY" in line and "screened best 1.250x cuBLAS" in line
               for line in lines)


def test_a_device_known_only_from_the_workers_gets_its_spaces_then(monkeypatch):
    """A Ray cluster's GPUs are not known before its workers report: the summary says so, and
    the spaces follow the workers' report."""
    monkeypatch.setattr(tunefw.tune.space, "CHECKS_BUDGET", 43200)  # counted exactly
    spec = parse_study({"name": "c", "trials": 4, "families": ["stream_sm90"],
                        "problems": ["16x28672x4096"]}, "test")
    lines = startup_lines(spec, "cuda", 8, None)
    assert lines == [
        "launch c: backend cuda, 8 GPU worker(s), 1 problem(s) x 4 trials = 4 trials budget "
        "(sampler tpe, confirm top 3)",
        "  families: stream_sm90; valid-space sizes once the workers report their device"]
    progress, text = _progress(spaces_for=spec)
    with progress:
        progress.hook("start", {"study": "c", "backend": "cuda", "device": H200.name,
                                "device_spec": H200, "families": ["stream_sm90"],
                                "workers": ["0"], "problems": []})
    assert ("  stream_sm90: 43,200 configs declared; valid on NVIDIA H200: 4,240 for "
            "16x28672x4096") in text.getvalue().splitlines()
