"""TPE in its own process, so a sweep's driver does not spend its one Python thread on it.

On the H200 a one-GPU sweep's asker thread spent 10.9 of 20 s asking (28 ms an ask, contended
by the driver's own work under the GIL); eight GPUs would need eight times the asks.
``RemoteTPE`` is an Optuna sampler whose methods run in a host process on a replica of the
study: before each request the driver sends the trials completed since the last one and the
config keys that became known, so the replica's TPE (a ``ScreenedTPE`` with the same seed)
sees what the local one would. The driver's asker thread waits on a pipe meanwhile (the GIL
is free). One host serves every problem of a launch; it exits when its pipe closes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any, Iterable

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tunefw.device import DeviceSpec
from tunefw.framing import helper_pythonpath, recv, send
from tunefw.problem import GemmProblem
from tunefw.tune.sampling import forget_cached_trials, make_sampler, screen_candidates


class SamplerHostError(RuntimeError):
    """The sampler process died or answered with an error."""


class SamplerHost:
    """The driver's handle on the host process (started here, stopped by close())."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=helper_pythonpath())
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from tunefw.tune.sampler_host import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            start_new_session=True)  # Ctrl-C is the driver's to handle; the host ends with its pipe
        self._lock = threading.Lock()  # one request and its answer at a time
        self._next_key = 0

    def call(self, *request: Any) -> Any:
        with self._lock:
            try:
                send(self._proc.stdin, request)
                answer = recv(self._proc.stdout)
            except (BrokenPipeError, OSError) as exc:
                raise SamplerHostError(f"the sampler process is gone ({exc})") from None
        if answer is None:
            raise SamplerHostError(f"the sampler process exited ({self._proc.poll()})")
        ok, value = answer
        if not ok:
            raise SamplerHostError(f"the sampler process failed: {value}")
        return value

    def sampler(self, seed: int, families: list[str], problem: GemmProblem,
                device: DeviceSpec) -> "RemoteTPE":
        """A new remote TPE for one problem's search."""
        self._next_key += 1
        self.call("open", self._next_key, seed, families, problem, device)
        return RemoteTPE(self, self._next_key)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()


class RemoteTPE(optuna.samplers.BaseSampler):
    """Optuna sampler proxy: every decision is made by the host's replica of this study."""

    def __init__(self, host: SamplerHost, key: int) -> None:
        self.host, self.key = host, key
        self._sent_trials: set[int] = set()
        self._sent_known: set[str] = set()
        self.known: Iterable[str] = ()  # set by the search before each ask
        # The replica's ScreenedTPE.redraws and .missed, as its last relative sample left them
        self.redraws = 0
        self.missed = False

    def _updates(self, study: optuna.Study) -> tuple[list[FrozenTrial], list[str]]:
        """Trials completed and keys known since the last request."""
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        # A request per sampler call, several per ask: most find nothing new.
        new = ([t for t in done if t.number not in self._sent_trials]
               if len(done) > len(self._sent_trials) else [])
        self._sent_trials.update(t.number for t in new)
        known = set(self.known) - self._sent_known
        self._sent_known |= known
        return new, sorted(known)

    def _call(self, study: optuna.Study, method: str, *args: Any) -> Any:
        trials, known = self._updates(study)
        return self.host.call(method, self.key, trials, known, *args)

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return self._call(study, "space", trial)

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        if not search_space:
            return {}
        params, self.redraws, self.missed = self._call(study, "relative", trial, search_space)
        return params

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        return self._call(study, "independent", trial, param_name, param_distribution)


# ---- the host process ---------------------------------------------------------------------
class _Replica:
    """One problem's study as the host sees it, and the local sampler that decides for it."""

    def __init__(self, seed: int, families: list[str], problem: GemmProblem,
                 device: DeviceSpec) -> None:
        self.sampler = make_sampler("tpe", seed, len(families))
        self.study = optuna.create_study(direction="maximize", sampler=self.sampler)
        self.known: set[str] = set()
        self.sampler.screen = lambda samples: screen_candidates(samples, families, problem,
                                                                device, self.known)

    def update(self, trials: list[FrozenTrial], known: list[str]) -> None:
        for trial in trials:
            self.study.add_trial(trial)
        self.known.update(known)
        # Study.ask() drops the trial list TPE caches; the replica never asks, so drop it here
        # (without this the replica's TPE decides on stale trials).
        forget_cached_trials(self.study)


def _answer(replicas: dict[int, _Replica], request: tuple) -> Any:
    method, key, *args = request
    if method == "open":
        replicas[key] = _Replica(*args)
        return None
    replica = replicas[key]
    trials, known, *args = args
    replica.update(trials, known)
    if method == "space":
        return replica.sampler.infer_relative_search_space(replica.study, *args)
    if method == "relative":  # with the counts the driver's search and stats read
        params = replica.sampler.sample_relative(replica.study, *args)
        return params, replica.sampler.redraws, replica.sampler.missed
    if method == "independent":
        return replica.sampler.sample_independent(replica.study, *args)
    raise ValueError(f"unknown request {method!r}")


def serve() -> None:
    """Host main loop: requests on stdin, (ok, value) answers on the original stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the protocol
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    replicas: dict[int, _Replica] = {}
    while (request := recv(sys.stdin.buffer)) is not None:
        try:
            answer = (True, _answer(replicas, request))
        except Exception as exc:  # the driver raises it as SamplerHostError
            answer = (False, f"{type(exc).__name__}: {exc}")
        send(out, answer)
