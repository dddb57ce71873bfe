"""Study files: the YAML a user writes, validated into a StudySpec (one-line errors on bad input)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunefw.errors import UserError
from tunefw.problem import DTYPES, GemmProblem, parse_shape
from tunefw.rules import model_token_counts

SAMPLERS = ("tpe", "random", "grid", "cmaes")
FAULTS = ("crash", "hang", "wrong", "compile_error")
DEFAULT_TRIALS = 64
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_SIM_TRIAL_S = 1.0
# Linear layers of a transformer block, as (label, N, K) from the model's sizes (TN: K = inputs).
MODEL_LAYERS = (
    ("qkv", "qkv", "hidden"),
    ("o_proj", "hidden", "hidden"),
    ("gate_up", "2*intermediate", "hidden"),
    ("down", "hidden", "intermediate"),
)
TOP_KEYS = {"name", "dtype", "families", "sampler", "trials", "timeout_s", "seed", "problems",
            "models", "sim", "reuse", "confirm_top"}


@dataclass
class SimSettings:
    """Simulated-device knobs: real wall time per trial and fault rates (0..1)."""

    trial_seconds: float = DEFAULT_SIM_TRIAL_S
    faults: dict[str, float] = field(default_factory=lambda: {f: 0.0 for f in FAULTS})


@dataclass
class StudySpec:
    name: str
    problems: list[GemmProblem]
    labels: list[str]
    dtype: str = "bf16"
    families: list[str] | None = None  # None: every family the device supports
    sampler: str = "tpe"
    trials: int = DEFAULT_TRIALS
    timeout_s: float = DEFAULT_TIMEOUT_S
    seed: int = 0
    reuse: bool = True  # reuse a stored result of the same config, source, evaluator and device
    confirm_top: int = 3
    sim: SimSettings = field(default_factory=SimSettings)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["problems"] = [dict(p.as_dict(), label=l) for p, l in zip(self.problems, self.labels)]
        del d["labels"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StudySpec":
        return parse_study(d, source="stored study")


def _err(source: str, msg: str) -> UserError:
    return UserError(f"{source}: {msg}")


def _int(source: str, field_name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _err(source, f"{field_name}={value!r}: expected an integer >= {minimum}")
    return value


def _number(source: str, field_name: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise _err(source, f"{field_name}={value!r}: expected a number >= {minimum:g}")
    return float(value)


def _problem(source: str, where: str, M: Any, N: Any, K: Any, dtype: str) -> GemmProblem:
    try:
        return GemmProblem(M, N, K, dtype)
    except UserError as exc:
        raise _err(source, f"{where}: {exc}") from None


def _problems(source: str, d: dict, dtype: str) -> tuple[list[GemmProblem], list[str]]:
    problems: list[GemmProblem] = []
    labels: list[str] = []
    raw = d.get("problems") or []
    if not isinstance(raw, list):
        raise _err(source, "problems: expected a list of {M, N, K} or {shape: MxNxK}")
    for i, item in enumerate(raw):
        where = f"problems[{i}]"
        if isinstance(item, str):
            item = {"shape": item}
        if not isinstance(item, dict):
            raise _err(source, f"{where}: expected {{M, N, K}} or {{shape: MxNxK}}")
        p_dtype = item.get("dtype", dtype)
        if p_dtype not in DTYPES:
            raise _err(source, f"{where}.dtype={p_dtype!r}: expected one of {', '.join(DTYPES)}")
        if "shape" in item:
            try:
                p = parse_shape(str(item["shape"]), p_dtype)
            except UserError as exc:
                raise _err(source, f"{where}: {exc}") from None
        else:
            missing = [k for k in ("M", "N", "K") if k not in item]
            if missing:
                raise _err(source, f"{where}: missing {', '.join(missing)}")
            p = _problem(source, where, item["M"], item["N"], item["K"], p_dtype)
        problems.append(p)
        labels.append(str(item.get("label", "")))
    models = d.get("models") or []
    if not isinstance(models, list):
        raise _err(source, "models: expected a list of {name, hidden, intermediate, qkv, M: [..]}")
    for i, model in enumerate(models):
        where = f"models[{i}]"
        if not isinstance(model, dict):
            raise _err(source, f"{where}: expected a mapping")
        sizes = {}
        for key in ("hidden", "intermediate", "qkv"):
            if key not in model:
                raise _err(source, f"{where}: missing {key}")
            sizes[key] = _int(source, f"{where}.{key}", model[key])
        sizes["2*intermediate"] = 2 * sizes["intermediate"]
        ms = model_token_counts(source, where, model.get("M"))  # the M grid: tunefw/rules.py
        name = str(model.get("name", f"model{i}"))
        for m in ms:
            for label, n_key, k_key in MODEL_LAYERS:
                problems.append(_problem(source, f"{where} {label} M={m}", m, sizes[n_key],
                                         sizes[k_key], dtype))
                labels.append(f"{name}.{label}")
    if not problems:
        raise _err(source, "no problems: give 'problems' and/or 'models'")
    seen: dict[GemmProblem, int] = {}
    unique_p, unique_l = [], []
    for p, l in zip(problems, labels):
        if p not in seen:  # two layers of one model can share a shape: tune it once
            seen[p] = len(unique_p)
            unique_p.append(p)
            unique_l.append(l)
    return unique_p, unique_l


def parse_study(d: Any, source: str, name: str | None = None) -> StudySpec:
    """Validate a study mapping (from YAML or the database)."""
    from tunefw.templates import FAMILIES

    if not isinstance(d, dict):
        raise _err(source, "expected a mapping at the top level")
    unknown = set(d) - TOP_KEYS
    if unknown:
        raise _err(source, f"unknown key(s) {', '.join(sorted(unknown))}; "
                           f"expected some of {', '.join(sorted(TOP_KEYS))}")
    study_name = name or d.get("name")
    if not study_name or not isinstance(study_name, str):
        raise _err(source, "name: expected a study name (in the file or as NAME)")
    dtype = d.get("dtype", "bf16")
    if dtype not in DTYPES:
        raise _err(source, f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    families = d.get("families")
    if families is not None:
        if isinstance(families, str):
            families = [families]
        if not isinstance(families, list) or not families:
            raise _err(source, "families: expected a list of family names")
        for f in families:
            if f not in FAMILIES:
                raise _err(source, f"families: unknown family {f!r}; expected one of "
                                   f"{', '.join(sorted(FAMILIES))}")
    sampler = d.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise _err(source, f"sampler={sampler!r}: expected one of {', '.join(SAMPLERS)}")
    sim_raw = d.get("sim") or {}
    if not isinstance(sim_raw, dict):
        raise _err(source, "sim: expected a mapping {trial_seconds, faults}")
    faults = {f: 0.0 for f in FAULTS}
    for f, rate in (sim_raw.get("faults") or {}).items():
        if f not in FAULTS:
            raise _err(source, f"sim.faults: unknown fault {f!r}; expected {', '.join(FAULTS)}")
        faults[f] = _number(source, f"sim.faults.{f}", rate)
        if faults[f] > 1:
            raise _err(source, f"sim.faults.{f}={rate}: expected a rate between 0 and 1")
    problems, labels = _problems(source, d, dtype)
    return StudySpec(
        name=study_name, problems=problems, labels=labels, dtype=dtype, families=families,
        sampler=sampler,
        trials=_int(source, "trials", d.get("trials", DEFAULT_TRIALS)),
        timeout_s=_number(source, "timeout_s", d.get("timeout_s", DEFAULT_TIMEOUT_S), 1.0),
        seed=_int(source, "seed", d.get("seed", 0), 0),
        reuse=bool(d.get("reuse", True)),
        confirm_top=_int(source, "confirm_top", d.get("confirm_top", 3), 0),
        sim=SimSettings(
            trial_seconds=_number(source, "sim.trial_seconds",
                                  sim_raw.get("trial_seconds", DEFAULT_SIM_TRIAL_S)),
            faults=faults),
    )


def load_study_file(path: Path, name: str | None = None) -> StudySpec:
    """Read and validate a study YAML file."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"{source}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{source}: malformed YAML{where}") from None
    return parse_study(data, source, name)
