"""`tunefw report`: the study's page, assembled from the data, figures and tables of this package."""
from __future__ import annotations

import html
import math
from pathlib import Path

from tunefw.export.files import write_atomic
from tunefw.report.data import StudyReport, study_data
from tunefw.report.page import fingerprint_html, note, page, section
from tunefw.report.ptxas import compile_missing
from tunefw.report.search_figures import convergence_figure, knob_figure, trials_figure
from tunefw.report.shape_figures import ratio_figure, roofline_figure
from tunefw.report.shapes import ceilings, is_loss, ratio_of, roof_basis
from tunefw.report.tables import outcomes_table, winners_tables
from tunefw.store import Store


def summary_html(data: StudyReport) -> str:
    """The headline: shapes won and lost against cuBLAS, the geomean ratio, the device and
    its ceilings, and what kind of result this is."""
    ratios = [r for r in map(ratio_of, data.problems) if r is not None]
    losses = [p.label for p in data.problems if is_loss(ratio_of(p))]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    evaluated = sum(len(p.trials) for p in data.problems)
    items = [
        f"{len(data.problems)} problem(s), {evaluated} evaluated trial(s), backend "
        f"{data.backend or 'not launched yet'}",
        f"{len(ratios) - len(losses)} shape(s) at or above cuBLAS, {len(losses)} below"
        + (f": {', '.join(losses)}" if losses else ""),
        "geomean ratio to cuBLAS of the best configs: "
        + (f"{geomean:.3f}" if geomean is not None else "-"),
        f"device: {data.fingerprint.get('name', 'none yet')}"
        + (f"; ceilings: {'; '.join(c.label for c in ceilings(data.device))}" if data.device
           else "; no rates declared for it in tunefw/device.py" if data.fingerprint else ""),
    ]
    if data.kind:
        items.append(f"every number on this page is {data.kind}, not measured on a GPU by "
                     "this study")
    body = "".join(f"<li>{html.escape(i)}</li>" for i in items)
    return section("summary", "Summary", f'<ul class="summary">{body}</ul>')


def _ratio_section(data: StudyReport) -> str:
    if not any(ratio_of(p) is not None for p in data.problems):
        return section("ratio", "Ratio to cuBLAS per shape",
                       note("No OK trial with a cuBLAS figure yet."))
    figure = ratio_figure(data.problems, data.kind)
    return section("ratio", "Ratio to cuBLAS per shape", figure, note(
        "TFLOP/s of each shape's best config over cuBLAS's timed on the same screen (a "
        "confirmed winner: its interleaved re-timing), sorted worst first. `tunefw export` "
        "routes a shape below 1.0 to cuBLAS by default (--min-ratio)."))


def _roofline_section(data: StudyReport) -> str:
    title = "Roofline"
    if not data.fingerprint:
        return section("roofline", title, note("No device yet: the study has not been launched."))
    if data.device is None:
        return section("roofline", title, note(
            f"No rates are declared for {data.fingerprint.get('name', 'this device')!r} in "
            "tunefw/device.py, so there is no roofline."))
    text = ("Bytes: A, B and C each moved once (the fewest a GEMM can move); FLOPs 2MNK. Ceilings "
            "from tunefw/device.py: measured = timed on that GPU, declared = datasheet. The "
            f"winners table's fraction of roofline is against the {roof_basis(data.device)}.")
    if data.kind == "SIMULATED":
        text += (" SIMULATED points come from tunefw's cost model, so they may sit above a "
                 "measured ceiling.")
    return section("roofline", title, roofline_figure(data.problems, data.device, data.kind),
                   note(text))


def _search_sections(data: StudyReport) -> list[str]:
    trials = [t for p in data.problems for t in p.trials]
    if not trials:
        return [section("convergence", "Search convergence", note("No evaluated trial yet."))]
    families = [f for f in data.families if any(t.family == f and t.ratio is not None
                                                for t in trials)]
    knobs = [knob_figure(f, trials, data.kind) for f in families]
    return [
        section("convergence", "Search convergence", convergence_figure(data.problems, data.kind),
                note("Trial number: evaluated trials of the problem (INVALID configs cost no "
                     "device time and are not counted).")),
        section("knobs", "Effect of each knob", *knobs, note(
            "Ratios of the OK trials, every problem of the study pooled: a box mixes shapes, so "
            "read it for direction rather than size; n = OK trials with that value.")),
        section("trials", "All trials", trials_figure(data.problems, data.families, data.kind)),
    ]


def study_html(data: StudyReport) -> str:
    """The report page of a study."""
    winners = section("winners", "Winning configs", winners_tables(data), note(
        "ratio, TFLOP/s: the confirmation's interleaved re-timing where confirmed; screen "
        "ratio: the same config's trial, as the search saw it. regs/thread (est.) is the "
        "family's analytic estimate (its validity check uses it); the (ptxas) columns are what "
        "ptxas reported for the trial's kernel ('ptxas from': trial), or for the same config "
        "compiled when this page was made (`tunefw report --ptxas`: where the trial stored "
        "none, as on the simulated device, a replay or a database older than these columns), "
        "empty otherwise. CTAs, threads and dynamic shared memory are the launch plan's."))
    return page(f"tunefw study {data.name} (round {data.round})", data.kind, [
        summary_html(data), _ratio_section(data), _roofline_section(data),
        *_search_sections(data), winners,
        section("outcomes", "Outcomes", outcomes_table(data)), fingerprint_html(data.fingerprint)])


def write_report(store: Store, name: str, path: Path, ptxas: bool = False,
                 cache_dir: Path | None = None) -> dict:
    """Write the study's HTML report to ``path`` (``ptxas``: first compile the winners whose
    trial stored no ptxas figures); returns what the CLI prints: the problems' labels, whether
    the results are SIMULATED (``kind``: SIMULATED, REPLAY or None), the winners compiled."""
    data = study_data(store, name)
    compiled = compile_missing(data, cache_dir) if ptxas else 0
    write_atomic(path, study_html(data))
    return {"problems": [p.label for p in data.problems], "simulated": data.kind == "SIMULATED",
            "kind": data.kind, "compiled": compiled}
