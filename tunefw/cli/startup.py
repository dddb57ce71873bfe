"""What `tunefw launch` says first: the backend, the GPU workers, the trials budget (before Ray
starts), and each family's search space for the study's problems (declared, and valid on the
device the workers will report: counted while Ray starts where that device is known ahead,
else once they report it)."""
from __future__ import annotations

from tunefw.cli.render import tag
from tunefw.device import SIM_DEVICE, DeviceSpec
from tunefw.study.spec import StudySpec
from tunefw.tune.space import SpaceSize, space_sizes

PROBLEMS_LISTED = 4  # up to this many problems, each one's valid-space size; beyond, a range
KIND = {"sim": "SIMULATED", "replay": "REPLAY"}


def expected_device(backend: str, replay: str | None, address: str | None) -> DeviceSpec | None:
    """The device the workers will report, where it is known before they start: the simulated
    H200, the replayed sweeps' device, this machine's GPU 0; None for a Ray cluster's GPUs (or
    a driver that cannot be read here)."""
    if backend == "sim":
        return SIM_DEVICE
    if backend == "replay":
        from tunefw.evaluate.replay import parse_backend, recorded_device
        from tunefw.evaluate.sweepfile import read_sweep, sweep_paths
        return recorded_device(read_sweep(sweep_paths(parse_backend(replay or "")[0])[0]))
    if address is not None:
        return None
    try:
        from tunefw.cuda.driver import local_spec
        return local_spec(0)
    except Exception:  # no CUDA driver to ask here: the workers will say
        return None


def _count(n: int, exact: bool) -> str:
    if not n:
        return "none"
    if exact:
        return f"{n:,}"
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"~{n / size:.3g}{unit}"
    return f"~{n}"


def _valid(size: SpaceSize, keys: list[str]) -> str:
    exact = size.sampled == 0
    if len(keys) <= PROBLEMS_LISTED:
        return ", ".join(f"{_count(v, exact)} for {k}" for v, k in zip(size.valid, keys))
    served = [v for v in size.valid if v]
    if not served:
        return f"none for any of the {len(keys)} problems"
    low, high = _count(min(served), exact), _count(max(served), exact)
    text = (low if low == high else f"{low} to {high}") + f" per problem for {len(served)}"
    missing = len(keys) - len(served)
    return text + (f", none for {missing}" if missing else "")


def space_lines(spec: StudySpec, families: list[str], device: DeviceSpec,
                backend: str) -> list[str]:
    """One line per family: configs declared, valid per problem on ``device`` (exact, or
    estimated and marked ~), and a note on how the estimate was made."""
    sizes = space_sizes(families, spec.problems, device, spec.seed)
    keys = [p.key().split(":")[0] for p in spec.problems]
    lines = [f"  {s.family}: {s.declared:,} configs declared; valid on {device.name}"
             f"{tag(KIND.get(backend))}: {_valid(s, keys)}" for s in sizes]
    sampled = max(s.sampled for s in sizes)
    if sampled:
        lines.append(f"  (~: estimated from {sampled:,} random configs per family and problem)")
    return lines


def startup_lines(spec: StudySpec, backend: str, gpus: int, device: DeviceSpec | None) -> list[str]:
    """The summary's first line: backend, GPU workers, trials budget; where the device is not
    known ahead, a line saying the spaces follow the workers' report (space_lines' lines come
    once it is known: they take a second or more, so they are counted while Ray starts)."""
    kind = KIND.get(backend)
    budget = spec.trials * len(spec.problems)
    lines = [f"launch {spec.name}: backend {backend}" + (f" ({kind} device)" if kind else "")
             + f", {gpus} GPU worker(s), {len(spec.problems)} problem(s) x {spec.trials} "
             f"trials = {budget} trials budget (sampler {spec.sampler}, confirm top "
             f"{spec.confirm_top})"]
    if device is None:
        names = spec.families or ["every family the device supports"]
        lines.append(f"  families: {', '.join(names)}; valid-space sizes once the workers report "
                     "their device")
    return lines
