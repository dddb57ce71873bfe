"""Recorded sweeps: one problem's trials of a study in a small gzip JSON-lines file.

Line 1 is the header (``format`` = FORMAT): the study, the problem, the families' space hashes
(and ``spaces``, their declarations, so that a later space that only adds knobs or values still
reads the file) and source hashes, the device fingerprint and timing method, the confirmed
winner, and the file's ``coverage`` (distinct valid configs it holds out of the valid space of the declared
families, when that space is still the current one). Every further line is one trial row:
``family, config, outcome, ratio, median_ms, tflops, cublas_tflops`` (+ ``reason``, the first
log line, for outcomes other than OK). Written by ``tunefw export --format sweep``
(tunefw/export/sweeps.py); read by the replay backend and ``tunefw search-eval``.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from tunefw.errors import UserError
from tunefw.outcome import Status, fingerprint_key
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES, config_key, get_family

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

    def space_reason(self, family: str) -> str | None:
        """None where the family's recorded space is today's, or one today's extends (the
        header's ``spaces`` declaration: read_sweep then upgraded the rows); else why not."""
        recorded = (self.header.get("space_hashes") or {}).get(family)
        if family not in FAMILIES:
            return f"family {family} is not declared here"
        if get_family(family).space_hash() == recorded:
            return None
        declared = (self.header.get("spaces") or {}).get(family)
        if declared is None:
            return (f"recorded under {family} parameter space {recorded}, the family's space is "
                    f"now {get_family(family).space_hash()} (no declaration recorded to compare)")
        why = get_family(family).extension_reason(declared)
        return None if why is None else f"recorded under an earlier {family} space: {why}"

    def stale_families(self) -> list[str]:
        """Families whose recorded space is neither today's nor one today's extends."""
        return sorted(f for f in self.header.get("space_hashes") or {} if self.space_reason(f))


def _identity(sweep: Sweep) -> tuple:
    """What recordings must share to merge: problem, timing method, spaces, device."""
    return (sweep.header.get("problem"), sweep.method, sweep.header.get("space_hashes"),
            fingerprint_key(sweep.header.get("fingerprint") or {}))


def merge_sweeps(sweeps: list[Sweep]) -> Sweep:
    """One sweep of a problem from several recordings of it (a uniform sample and seeded TPE
    runs, say): their rows in order (the first row of a config is its outcome), the winner with
    the best confirmed ratio, and the coverage of the union. Recordings of another problem,
    timing method, parameter space or device are refused (one-line error)."""
    first = sweeps[0]
    for other in sweeps[1:]:
        for what, a, b in zip(("problem", "method", "space", "device"), _identity(other),
                              _identity(first)):
            if a != b:
                raise UserError(f"{other.path}: another {what} than {first.path}: only "
                                "recordings of one problem on one device and space merge")
    header = dict(first.header)
    names = [sw.header.get("study") or "" for sw in sweeps]
    common = os.path.commonprefix(names).rstrip("_-.")
    winners = [sw.header["winner"] for sw in sweeps if (sw.header.get("winner") or {}).get("ratio")]
    merged = Sweep(header, [row for sw in sweeps for row in sw.rows],
                   " + ".join(sw.path for sw in sweeps))
    distinct = len(merged.measured())
    valid = (first.header.get("coverage") or {}).get("valid_space")
    header.update(study=common or "+".join(names), merged_from=[sw.path for sw in sweeps],
                  sampler="+".join(sorted({str(sw.header.get("sampler")) for sw in sweeps})),
                  rows=len(merged.rows),
                  winner=max(winners, key=lambda w: w["ratio"]) if winners else None,
                  coverage={"distinct_measured": distinct, "valid_space": valid,
                            "fraction": round(distinct / valid, 5) if valid else None})
    return merged


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
    return _in_todays_space(Sweep(header, rows, str(path)))


def _in_todays_space(sweep: Sweep) -> Sweep:
    """The sweep with the configs of each family whose recorded space is today's or one today's
    extends written in today's space (knobs added since at their absent value; upgrade() leaves
    a config of today's space as it is), so they key like today's."""
    extended = [f for f in sweep.header.get("space_hashes") or {} if not sweep.space_reason(f)]
    for row in sweep.rows:
        if row.family in extended:
            row.config = get_family(row.family).upgrade(row.config)
    winner = sweep.header.get("winner") or {}
    if winner.get("family") in extended:
        sweep.header["winner"] = {**winner,
                                  "config": get_family(winner["family"]).upgrade(winner["config"])}
    return sweep


def declared_spaces(hashes: dict) -> dict:
    """The space declaration of each family whose recorded hash is today's (a sweep header's
    ``spaces``: what lets a later space that extends it read the sweep)."""
    return {f: get_family(f).space_declaration() for f, h in hashes.items()
            if f in FAMILIES and get_family(f).space_hash() == h}


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
