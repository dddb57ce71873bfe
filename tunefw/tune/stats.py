"""A launch's sweep figures: trials/s and busy time per worker, and where idle worker time went
(what each worker with nothing queued waited for, how deep each pipeline stage ran)."""
from __future__ import annotations

from typing import Sequence

from tunefw.tune.asker import Asker
from tunefw.tune.pool import Slot, WorkerPool

STARVED_BY = ("start", "compile", "ask", "tail")  # why a GPU worker had nothing queued
STAGES = ("ready", "compiling", "pending")  # proposals ready, compiles in flight, jobs waiting


class LoopTimes:
    """Worker-seconds with an empty queue by cause, and stage depths integrated over time."""

    def __init__(self) -> None:
        self.starved = dict.fromkeys(STARVED_BY, 0.0)
        self.depth_s = dict.fromkeys(STAGES, 0.0)

    def charge(self, dt: float, slots: Sequence[Slot], ready: int, compiling: int,
               pending: int, can_ask: bool) -> None:
        """Charge ``dt`` to each worker with nothing queued, by what it waits for: its own start
        (a worker not up yet), a compile in flight, a proposal (``can_ask``: one is ready or a
        budget has room), or the end of the search; and add up the stages' depths."""
        self.depth_s["ready"] += dt * ready
        self.depth_s["compiling"] += dt * compiling
        self.depth_s["pending"] += dt * pending
        self.starved["start"] += dt * sum(1 for slot in slots if slot.up_at is None)
        idle = sum(1 for slot in slots if slot.up_at is not None and not slot.queue)
        if not idle:
            return
        cause = "compile" if compiling else "ask" if can_ask else "tail"
        self.starved[cause] += dt * idle


def _since(started: float | None, at: float | None) -> float | None:
    return None if started is None or at is None else round(max(0.0, at - started), 3)


def sweep_stats(pool: WorkerPool, times: LoopTimes, asker: Asker, wall_s: float,
                sampler_processes: int, backend: str, stopped: bool,
                started: float | None = None, first_result_at: float | None = None,
                rejected: int = 0) -> dict:
    """Trials/s and GPU busy of a launch's search phase (confirmation not included), the
    configs it stored as rejected without running (INVALID, NOT_RECORDED: rows with ids of
    their own), and its start-up: the seconds from the launch command (``started``,
    time.monotonic()) to its first worker up (Ray's start and one worker's), to every worker
    up (None: one never came up), and to its first finished trial (then the first compile and
    ask too)."""
    slots = pool.slots
    # a worker that never came up has no GPU name: it is named by its index
    gpus = [(pool.infos[s.index] or {}).get("gpu", f"worker {s.index} (never up)")
            for s in slots]
    ups = [s.up_at for s in slots]
    trials = sum(s.trials for s in slots)
    wall_s = max(wall_s, 1e-9)
    stats = {
        "wall_s": round(wall_s, 3), "workers": len(slots), "trials": trials,
        "rejected": rejected,
        "trials_per_s": trials / wall_s,
        "trials_per_s_per_gpu": {g: s.trials / wall_s for g, s in zip(gpus, slots)},
        "gpu_busy": {g: min(1.0, s.busy_s / wall_s) for g, s in zip(gpus, slots)},
        "restarts": sum(s.restarts for s in slots),
        # worker-seconds with an empty queue, by cause: the first place to look when busy is
        # low; "driver" is the rest of the idle time (a result waiting to be collected, Ray)
        "starved_s": {**{cause: round(v, 3) for cause, v in times.starved.items()},
                      "driver": round(max(0.0, len(slots) * wall_s
                                          - sum(s.busy_s for s in slots)
                                          - sum(times.starved.values())), 3)},
        "mean_depth": {stage: round(v / wall_s, 2) for stage, v in times.depth_s.items()},
        "asks": asker.asks, "ask_s": round(asker.ask_s, 3),
        # TPE draws the screen refused and drew again within an ask (sampler processes too)
        "screen_redraws": sum(st.search.redraws for st in asker.states),
        "sampler_processes": sampler_processes,
        "simulated": backend == "sim",
        "replay": backend == "replay",
        "stopped_at_time_limit": stopped,
        "first_worker_s": _since(started, min((t for t in ups if t is not None),
                                              default=None)),
        "workers_up_s": _since(started, None if None in ups else max(ups)),
        "first_trial_s": _since(started, first_result_at),
    }
    stats["gpu_busy_mean"] = sum(stats["gpu_busy"].values()) / max(len(slots), 1)
    return stats
