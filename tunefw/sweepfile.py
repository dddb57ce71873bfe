"""Recorded sweeps: one problem's trials of a study in a small gzip JSON-lines file.

Line 1 is the header (``format`` = FORMAT): the study, the problem, the families' space hashes
and source hashes, the device fingerprint and timing method, the confirmed winner, and the
file's ``coverage`` (distinct valid configs it holds out of the valid space of the declared
families, when that space is still the current one). Every further line is one trial row:
``family, config, outcome, ratio, median_ms, tflops, cublas_tflops`` (+ ``reason``, the first
log line, for outcomes other than OK). Written by ``tunefw export --format sweep``; read by the
replay backend and ``tunefw search-eval``.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from tunefw.device import H200, DeviceSpec
from tunefw.errors import UserError
from tunefw.evaluate.outcome import Status, cublas_ratio
from tunefw.problem import GemmProblem
from tunefw.search import config_key, enumerate_valid
from tunefw.templates import FAMILIES, get_family

FORMAT = "tunefw-sweep"
VERSION = 1
SUFFIX = ".jsonl.gz"


@dataclass
class SweepRow:
    """One recorded trial."""

    family: str
    config: dict
    outcome: str
    ratio: float | None = None
    median_ms: float | None = None
    tflops: float | None = None
    cublas_tflops: float | None = None
    reason: str = ""

    @property
    def key(self) -> str:
        return config_key(self.family, self.config)

    def as_dict(self) -> dict:
        d = {"family": self.family, "config": self.config, "outcome": self.outcome}
        for name in ("ratio", "median_ms", "tflops", "cublas_tflops"):
            value = getattr(self, name)
            if value is not None:
                d[name] = float(f"{value:.6g}")
        if self.reason:
            d["reason"] = self.reason
        return d


@dataclass
class Sweep:
    """A recorded sweep of one problem: header facts and rows (first row of each config kept)."""

    header: dict
    rows: list[SweepRow] = field(default_factory=list)
    path: str = ""

    @property
    def problem(self) -> GemmProblem:
        return GemmProblem(**self.header["problem"])

    @property
    def method(self) -> str | None:
        return self.header.get("method")

    def by_key(self) -> dict[str, SweepRow]:
        out: dict[str, SweepRow] = {}
        for row in self.rows:
            out.setdefault(row.key, row)
        return out

    def measured(self) -> list[SweepRow]:
        """Rows that were run on the device (every outcome but INVALID), one per config."""
        return [r for r in self.by_key().values() if r.outcome != Status.INVALID.value]

    def best_ratio(self) -> float | None:
        ratios = [r.ratio for r in self.rows if r.outcome == Status.OK.value and r.ratio]
        return max(ratios) if ratios else None

    def reference(self) -> tuple[float | None, str]:
        """The ratio search-eval measures against: the confirmed winner's screened ratio (the
        objective the search ranks by, for the config the confirmation chose), else the best
        screened ratio; and which of the two it is."""
        winner = self.header.get("winner") or {}
        if winner.get("config") is not None:
            row = self.by_key().get(config_key(winner["family"], winner["config"]))
            if row is not None and row.ratio:
                return row.ratio, "confirmed winner's screened ratio"
        return self.best_ratio(), "best screened ratio"

    def stale_families(self) -> list[str]:
        """Families whose recorded space hash is not the current declaration's."""
        hashes = self.header.get("space_hashes") or {}
        return sorted(f for f, h in hashes.items()
                      if f not in FAMILIES or get_family(f).space_hash() != h)


def problem_filename(problem: GemmProblem) -> str:
    return f"{problem.M}x{problem.N}x{problem.K}_{problem.dtype}_{problem.layout}{SUFFIX}"


def write_sweep(path: Path, sweep: Sweep) -> None:
    """Write a sweep file (gzip, deterministic bytes: no timestamp in the gzip header)."""
    lines = [json.dumps(sweep.header, sort_keys=True)]
    lines += [json.dumps(r.as_dict(), sort_keys=True) for r in sweep.rows]
    data = gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=9, mtime=0)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_sweep(path: Path | str) -> Sweep:
    """Read and validate one sweep file (one-line error on a bad one)."""
    path = Path(path)
    try:
        text = gzip.decompress(path.read_bytes()).decode()
    except OSError as exc:
        raise UserError(f"{path}: not a readable sweep file ({exc})") from None
    lines = text.splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
        rows = [SweepRow(**json.loads(line)) for line in lines[1:] if line.strip()]
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: malformed sweep file ({exc})") from None
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise UserError(f"{path}: not a {FORMAT} v{VERSION} file")
    for key in ("problem", "space_hashes", "method", "fingerprint"):
        if key not in header:
            raise UserError(f"{path}: header lacks {key!r}")
    try:
        GemmProblem(**header["problem"])
    except (TypeError, UserError) as exc:
        raise UserError(f"{path}: bad problem in header ({exc})") from None
    return Sweep(header, rows, str(path))


def sweep_paths(path: Path | str) -> list[Path]:
    """A sweep file, or every sweep file under a directory (sorted)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob(f"*{SUFFIX}"))
        if not found:
            raise UserError(f"{path}: no *{SUFFIX} sweep files in it")
        return found
    if not path.is_file():
        raise UserError(f"{path}: no such sweep file or directory")
    return [path]


def coverage(rows: list[SweepRow], space_hashes: dict, problem: GemmProblem,
             device: DeviceSpec = H200) -> dict:
    """Distinct valid configs measured, out of the valid space of the declared families (the
    space size only where every family's recorded space is the current declaration)."""
    measured = {r.key for r in rows if r.outcome != Status.INVALID.value}
    stale = [f for f, h in space_hashes.items() if f not in FAMILIES
             or get_family(f).space_hash() != h]
    out: dict = {"distinct_measured": len(measured)}
    if stale:
        out.update(valid_space=None, fraction=None,
                   note=f"recorded under an earlier space of {', '.join(stale)}: its valid-space "
                        "size is not known to this tunefw")
        return out
    valid = {config_key(f, c) for f, c in enumerate_valid(sorted(space_hashes), problem, device)}
    held = len(measured & valid)
    out.update(distinct_valid=held, valid_space=len(valid),
               fraction=round(held / len(valid), 5) if valid else None)
    return out


def _stable_fingerprint(fp: dict) -> dict:
    """The fingerprint without the clock, power and temperature read at one moment."""
    return {k: v for k, v in fp.items() if k not in ("sm_clock_mhz", "power_w", "temperature_c")}


def build_sweeps(store, study_name: str | None, problem_filter: GemmProblem | None = None,
                 source: str = "") -> list[Sweep]:
    """One Sweep per problem of the study's current round (the round's rows, first of each
    config, WORKER_LOST attempts left out; INVALID rows included with their reason)."""
    from tunefw.store import queries as q
    from tunefw.store.models import Winner

    sweeps = []
    with store.session() as s:
        study = q.get_study(s, study_name)
        problems = [p for p in study.problems
                    if problem_filter is None or q.as_problem(p) == problem_filter]
        if not problems:
            raise UserError(f"study {study.name!r} has no problem "
                            f"{problem_filter.key() if problem_filter else ''}")
        if study.fingerprint is None:
            raise UserError(f"study {study.name!r} was never launched: nothing to export")
        for prow in problems:
            seen, rows = set(), []
            for t in q.problem_trials(s, study, prow):
                if t.config_key in seen or t.status == Status.WORKER_LOST.value:
                    continue  # a lost attempt: its retry's row is the config's outcome
                seen.add(t.config_key)
                ok = t.status == Status.OK.value
                first = (t.log or "").strip().splitlines()[:1]
                rows.append(SweepRow(t.family, t.config, t.status,
                                     cublas_ratio(t.tflops, t.cublas_tflops) if ok else None,
                                     t.median_ms if ok else None, t.tflops if ok else None,
                                     t.cublas_tflops if ok else None,
                                     "" if ok else (first[0][:200] if first else "")))
            winner = s.get(Winner, prow.id)
            problem = q.as_problem(prow)
            hashes = dict(study.space_hashes or {})
            header = {
                "format": FORMAT, "version": VERSION, "study": study.name,
                "round": study.round, "problem": problem.as_dict(), "label": prow.label,
                "space_hashes": hashes,
                "source_hashes": sorted({t.source_hash for t in q.problem_trials(s, study, prow)}),
                "method": study.fingerprint.get("method"),
                "fingerprint": _stable_fingerprint(study.fingerprint),
                "evaluator": study.backend, "sampler": study.spec.get("sampler"),
                "seed": study.spec.get("seed"), "budget": study.spec.get("trials"),
                "rows": len(rows), "source": source,
                "winner": None if winner is None else {
                    "family": winner.family, "config": winner.config, "tflops": winner.tflops,
                    "cublas_tflops": winner.cublas_tflops,
                    "ratio": cublas_ratio(winner.tflops, winner.cublas_tflops),
                    "confirmed": winner.confirmed, "trial_id": winner.trial_id},
                "coverage": coverage(rows, hashes, problem),
            }
            sweeps.append(Sweep(header, rows))
    return sweeps


def export_sweeps(store, study_name: str | None, out: Path, problem: GemmProblem | None = None,
                  source: str = "") -> list[Path]:
    """Write one sweep file per problem: ``out`` is a directory, or a file for one problem."""
    sweeps = build_sweeps(store, study_name, problem, source)
    out = Path(out)
    if str(out).endswith(SUFFIX):
        if len(sweeps) != 1:
            raise UserError(f"{out}: one file holds one problem, the study has {len(sweeps)} "
                            "(give a directory, or --problem MxNxK)")
        paths = [out]
    else:
        paths = [out / problem_filename(sw.problem) for sw in sweeps]
    for path, sw in zip(paths, sweeps):
        write_sweep(path, sw)
    return paths
