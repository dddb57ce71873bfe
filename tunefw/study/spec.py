"""Study files: the YAML a user writes, validated into a StudySpec (one-line errors on bad input)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tunefw.errors import UserError
from tunefw.problem import GemmProblem, parse_shape
from tunefw.study.schema import (DEFAULT_SIM_TRIAL_S, DEFAULT_TIMEOUT_S, DEFAULT_TRIALS, FAULTS,
                                 SAMPLERS, ProblemEntry, Sim, StudyFile, describe)

__all__ = ["SAMPLERS", "FAULTS", "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S", "DEFAULT_SIM_TRIAL_S",
           "SimSettings", "StudySpec", "parse_study", "load_study_file"]
PROBLEMS_MAX = 4096  # problems of one study, after expanding models
FILE_MAX_BYTES = 1 << 20
# Linear layers of a transformer block, as (label, N, K) from the model's sizes (TN: K = inputs).
MODEL_LAYERS = (
    ("qkv", "qkv", "hidden"),
    ("o_proj", "hidden", "hidden"),
    ("gate_up", "2*intermediate", "hidden"),
    ("down", "hidden", "intermediate"),
)


@dataclass
class SimSettings:
    """Simulated-device knobs: real wall time per trial and fault rates (0..1)."""

    trial_seconds: float = DEFAULT_SIM_TRIAL_S
    faults: dict[str, float] = field(default_factory=lambda: {f: 0.0 for f in FAULTS})


@dataclass
class StudySpec:
    """A validated study: its problems (with labels) and settings."""

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
        """The normalized mapping stored in the database (parse_study reads it back)."""
        d = asdict(self)
        d["problems"] = [dict(p.as_dict(), label=l) for p, l in zip(self.problems, self.labels)]
        del d["labels"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StudySpec":
        """Read back a stored study (validated like a file)."""
        return parse_study(d, source="stored study")


DEFAULT_M_GRID = tuple(2**i for i in range(14))  # 1, 2, 4, ..., 8192


def model_token_counts(source: str, where: str, listed: object) -> list[int]:
    """A models: entry's M values: the default grid (powers of two 1..8192) plus any listed M;
    a one-line UserError names a bad one."""
    if listed is None:
        listed = []
    if not isinstance(listed, list):
        raise UserError(f"{source}: {where}.M: expected a list of token counts")
    for m in listed:
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 2**31 - 1:
            raise UserError(f"{source}: {where}.M: {m!r}: expected an integer token count >= 1")
    return sorted(set(DEFAULT_M_GRID) | set(listed))


def _err(source: str, msg: str) -> UserError:
    return UserError(f"{source}: {msg}")


def _problem(source: str, where: str, M: Any, N: Any, K: Any, dtype: str,
             gate: str = "none") -> GemmProblem:
    try:
        return GemmProblem(M, N, K, dtype, gate=gate)
    except UserError as exc:
        raise _err(source, f"{where}: {exc}") from None


def _problems(source: str, doc: StudyFile) -> tuple[list[GemmProblem], list[str]]:
    problems: list[GemmProblem] = []
    labels: list[str] = []
    for i, item in enumerate(doc.problems or []):
        where = f"problems[{i}]"
        entry = ProblemEntry(shape=item) if isinstance(item, str) else item
        p_dtype = entry.dtype or doc.dtype
        if entry.shape is not None:
            try:
                p = parse_shape(entry.shape, p_dtype)
                if entry.gate != "none":  # the key's gate, else the shape's own ':silu'
                    p = replace(p, gate=entry.gate)
            except UserError as exc:
                raise _err(source, f"{where}: {exc}") from None
        else:
            p = _problem(source, where, entry.M, entry.N, entry.K, p_dtype, entry.gate)
        problems.append(p)
        labels.append(entry.label)
    for i, model in enumerate(doc.models or []):
        where = f"models[{i}]"
        sizes = {"hidden": model.hidden, "intermediate": model.intermediate, "qkv": model.qkv,
                 "2*intermediate": 2 * model.intermediate}
        for m in model_token_counts(source, where, model.M):
            for label, n_key, k_key in MODEL_LAYERS:
                gate = "silu" if model.gated and label == "gate_up" else "none"
                n = sizes["intermediate"] if gate != "none" else sizes[n_key]
                problems.append(_problem(source, f"{where} {label} M={m}", m, n, sizes[k_key],
                                         doc.dtype, gate))
                labels.append(f"{model.name or f'model{i}'}.{label}")
    if not problems:
        raise _err(source, "no problems: give 'problems' and/or 'models'")
    seen: dict[GemmProblem, int] = {}
    unique_p, unique_l = [], []
    for p, l in zip(problems, labels):
        if p not in seen:  # two layers of one model can share a shape: tune it once
            seen[p] = len(unique_p)
            unique_p.append(p)
            unique_l.append(l)
    if len(unique_p) > PROBLEMS_MAX:
        raise _err(source, f"{len(unique_p)} problems: expected at most {PROBLEMS_MAX}")
    return unique_p, unique_l


def parse_study(d: Any, source: str, name: str | None = None) -> StudySpec:
    """Validate a study mapping (from YAML or the database) against the schema."""
    if not isinstance(d, dict):
        raise _err(source, "expected a mapping at the top level")
    if name is not None:
        d = dict(d, name=name)
    try:
        doc = StudyFile.model_validate(d)
    except ValidationError as exc:
        raise _err(source, describe(exc)) from None
    except RecursionError:
        raise _err(source, "nested too deeply") from None
    if doc.name is None:
        raise _err(source, "name: expected a study name (in the file or as NAME)")
    problems, labels = _problems(source, doc)
    sim = doc.sim or Sim()
    return StudySpec(
        name=doc.name, problems=problems, labels=labels, dtype=doc.dtype, families=doc.families,
        sampler=doc.sampler, trials=doc.trials, timeout_s=float(doc.timeout_s), seed=doc.seed,
        reuse=doc.reuse, confirm_top=doc.confirm_top,
        sim=SimSettings(trial_seconds=float(sim.trial_seconds),
                        faults={f: float(getattr(sim.faults, f)) for f in FAULTS}))


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (the last would silently win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # unhashable or odd keys: the schema refuses them
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_study_file(path: Path, name: str | None = None) -> StudySpec:
    """Read and validate a study YAML file."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"{source}: cannot read ({exc.strerror})") from None
    if len(raw) > FILE_MAX_BYTES:
        raise UserError(f"{source}: {len(raw)} bytes; a study file is at most {FILE_MAX_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise UserError(f"{source}: YAML nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", "") or ""
        why = f" ({problem})" if problem.startswith("duplicate key") else ""
        raise UserError(f"{source}: malformed YAML{where}{why}") from None
    return parse_study(data, source, name)
