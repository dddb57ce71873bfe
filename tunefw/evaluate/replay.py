"""REPLAY device: answers trials from recorded sweeps (``tunefw export --format sweep``).

``--backend replay:PATH[?delay=SECONDS]``: PATH is a sweep file or a directory of them (one per
problem). Each config a sweep holds gets its recorded outcome, times and ratio to cuBLAS; a
config it does not hold gets NOT_RECORDED (nothing is invented): no device time, not counted
in a problem's budget, told to the sampler as a failure (like INVALID). The driver restricts
the search to the recorded configs (see ``recorded_keys``: TPE's screen draws again where a
draw holds none, the grid skips the others), so a budget is spent on them and a problem whose
recorded configs are all evaluated is done. ``delay`` is the wall time each
recorded trial takes (default 0), so scheduling behaves as on a device.

Everything it produces says REPLAY: the device name (``REPLAY NVIDIA H200``), the evaluator
``replay`` on every row, the progress display and the fingerprint of dispatch.json
(``"replay": true``) and the sweep's own timing method, so a study round never mixes it with
another. A sweep recorded under another parameter space than this tunefw's is refused.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import parse_qs

from tunefw.device import H200, KNOWN_DEVICES, DeviceSpec
from tunefw.errors import UserError
from tunefw.evaluate.sweepfile import Sweep, read_sweep, sweep_paths
from tunefw.outcome import Outcome, Status, TrialSpec, fingerprint_key
from tunefw.problem import GemmProblem
from tunefw.templates import config_key

PREFIX = "replay:"
NOT_RECORDED_REASON = "NOT_RECORDED: the recorded sweep does not hold this config"


def parse_backend(text: str) -> tuple[str, float]:
    """``replay:PATH[?delay=S]`` -> (absolute PATH, delay seconds); one-line error if bad."""
    if not text.startswith(PREFIX) or len(text) == len(PREFIX):
        raise UserError(f"--backend {text!r}: expected replay:PATH[?delay=SECONDS]")
    path, _, query = text[len(PREFIX):].partition("?")
    delay = 0.0
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key != "delay":
            raise UserError(f"--backend {text!r}: unknown option {key!r} (expected delay)")
        try:
            delay = float(values[-1])
        except ValueError:
            delay = -1.0
        if not delay >= 0:
            raise UserError(f"--backend {text!r}: delay={values[-1]!r}: expected seconds >= 0")
    return str(Path(path).expanduser().resolve()), delay


def replay_fingerprint(sweep: Sweep) -> dict:
    """The recorded device's fingerprint, labelled REPLAY (a replay never is that device)."""
    fp = dict(sweep.header["fingerprint"])
    fp["name"] = f"REPLAY {fp.get('name', '?')}"
    fp.update(replay=True, method=sweep.method, evaluator="replay")
    return fp


def recorded_device(sweep: Sweep) -> DeviceSpec:
    """The limits of the device a sweep was recorded on (the H200's where tunefw declares none
    for it)."""
    return KNOWN_DEVICES.get(sweep.header["fingerprint"].get("name", ""), H200)


class ReplaySource:
    """The sweeps under one path, by problem key."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sweeps: dict[str, Sweep] = {}
        for file in sweep_paths(path):
            sweep = read_sweep(file)
            key = sweep.problem.key()
            if key in self.sweeps:
                raise UserError(f"replay: two sweeps of {key} under {path} ({self.sweeps[key].path}, "
                                f"{file}): name one file or a directory of one study's sweeps")
            self.sweeps[key] = sweep

    def sweep_for(self, problem: GemmProblem) -> Sweep | None:
        return self.sweeps.get(problem.key())

    def check(self, problems: list[GemmProblem], families: list[str]) -> None:
        """Refuse a replay that would not answer like the recording: a problem without a sweep,
        another parameter space, sweeps of different devices or timing methods (a sweep answers
        under the method it was timed with: its trials carry it in their fingerprint)."""
        devices = set()
        for problem in problems:
            sweep = self.sweep_for(problem)
            if sweep is None:
                raise UserError(f"replay: no recorded sweep of {problem.key()} under {self.path} "
                                f"(it holds {', '.join(sorted(self.sweeps)) or 'none'})")
            for fam in sorted(sweep.header["space_hashes"]):
                why = sweep.space_reason(fam) if fam in families else None
                if why:  # today's space neither is nor extends the recorded one
                    raise UserError(f"replay: {sweep.path} {why}: record the sweep again")
            devices.add(fingerprint_key(replay_fingerprint(sweep)))
        if len(devices) > 1:
            raise UserError(f"replay: the sweeps under {self.path} come from {len(devices)} "
                            "devices: replay one device's sweeps at a time")

    def recorded_keys(self, problem: GemmProblem) -> frozenset[str]:
        """Config keys the problem's sweep holds (any outcome): the replay's search space."""
        sweep = self.sweep_for(problem)
        return frozenset(sweep.by_key()) if sweep else frozenset()


class ReplayEvaluator:
    """Evaluates a trial by looking it up in a recorded sweep (same interface as SimEvaluator)."""

    name = "replay"

    def __init__(self, backend: str, gpu: str = "") -> None:
        self.path, self.delay = parse_backend(backend)
        self.source = ReplaySource(self.path)
        self.gpu = gpu or os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self._index = {key: sw.by_key() for key, sw in self.source.sweeps.items()}

    def fingerprint(self) -> dict:
        return replay_fingerprint(next(iter(self.source.sweeps.values())))

    def device_spec(self) -> DeviceSpec:
        """The recorded device's limits (check() decides validity as it did there)."""
        return recorded_device(next(iter(self.source.sweeps.values())))

    def _lookup(self, spec: TrialSpec):
        problem = GemmProblem(**spec.problem)
        sweep = self.source.sweep_for(problem)
        rows = self._index.get(problem.key(), {})
        return sweep, rows.get(config_key(spec.family, spec.config))

    def _not_recorded(self, spec: TrialSpec, what: str = NOT_RECORDED_REASON) -> Outcome:
        sweep, _ = self._lookup(spec)
        fp = replay_fingerprint(sweep) if sweep else self.fingerprint()
        return Outcome(Status.NOT_RECORDED, log=f"REPLAY {what} ({self.path})", fingerprint=fp,
                       gpu=self.gpu, evaluator=self.name)

    def evaluate(self, spec: TrialSpec, compiled: object = None) -> Outcome:
        """The recorded outcome and figures of this config, after the configured delay."""
        sweep, row = self._lookup(spec)
        if sweep is None or row is None:
            return self._not_recorded(spec)
        if row.outcome != Status.INVALID.value and self.delay:
            time.sleep(self.delay)
        log = f"REPLAY of {sweep.path}: recorded {row.outcome}"
        if row.reason:
            log += f"\n{row.reason}"
        return Outcome(Status(row.outcome), log=log, median_ms=row.median_ms,
                       min_ms=row.median_ms, tflops=row.tflops,
                       cublas_tflops=row.cublas_tflops, fingerprint=replay_fingerprint(sweep),
                       gpu=self.gpu, evaluator=self.name,
                       busy_s=self.delay if row.outcome != Status.INVALID.value else 0.0)

    def confirm(self, spec: TrialSpec, compiled: object = None) -> Outcome:
        """The recorded confirmation: the sweep holds its winner's only, so any other config's
        confirmation is NOT_RECORDED (it cannot win a replay, as it did not win the recording)."""
        sweep, row = self._lookup(spec)
        winner = (sweep.header.get("winner") or {}) if sweep else {}
        if (row is None or winner.get("config") is None
                or config_key(winner["family"], winner["config"]) != row.key):
            return self._not_recorded(spec, "NOT_RECORDED: the recorded sweep holds the "
                                            "confirmation of its winner only")
        if self.delay:
            time.sleep(self.delay)
        return Outcome(Status.OK, log=f"REPLAY of {sweep.path}: recorded confirmation",
                       tflops=winner["tflops"], cublas_tflops=winner["cublas_tflops"],
                       median_ms=None, fingerprint=replay_fingerprint(sweep), gpu=self.gpu,
                       evaluator=self.name, busy_s=self.delay)
