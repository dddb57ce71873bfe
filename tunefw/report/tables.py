"""The report's tables: the winners of each family (one column per knob, launch facts, roofline
figures) and the outcome counts per problem."""
from __future__ import annotations

import html

from tunefw.outcome import Status
from tunefw.report.data import ProblemReport, StudyReport
from tunefw.report.page import table_html
from tunefw.report.ptxas import FROM_TRIAL
from tunefw.report.shapes import is_loss, launch_facts, ratio_of, shape_roof, verdict
from tunefw.templates import FAMILIES

FIXED = ["problem", "vs cuBLAS", "ratio", "screen ratio", "TFLOP/s", "cuBLAS TFLOP/s", "TB/s", "bound",
         "% of roofline", "cuBLAS % of roofline", "confirmed", "trial"]
LAUNCH = ["CTAs", "threads", "regs/thread (est.)", "dynamic smem B"]
PTXAS = ["regs/thread (ptxas)", "static smem B (ptxas)", "spill B (ptxas)", "ptxas from"]


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.0f}%"


def _ratio(value: float | None) -> str | None:
    return None if value is None else f"{value:.3f}"


def _row(data: StudyReport, p: ProblemReport, knobs: list[str]) -> list:
    """One winners row: verdict, ratios, rates, roofline, the config's knobs, launch facts,
    ptxas's figures for the winning trial's kernel."""
    b = p.best or {}
    ratio = ratio_of(p)
    roof = (shape_roof(p.problem, data.device, b["tflops"], b["cublas_tflops"])
            if data.device else None)
    facts = launch_facts(b["family"], b["config"], p.problem, data.device) if data.device else None
    return [p.label, verdict(ratio), _ratio(ratio), _ratio(b.get("screen_ratio")), b["tflops"],
            b["cublas_tflops"], roof.tbs if roof else None, roof.bound if roof else None,
            _percent(roof.fraction) if roof else None,
            _percent(roof.cublas_fraction) if roof else None, b["confirmed"], b["trial_id"],
            *(b["config"].get(k) for k in knobs),
            *((facts.ctas, facts.threads, facts.regs_estimate, facts.dynamic_smem) if facts
              else (None,) * len(LAUNCH)),
            b.get("ptxas_regs"), b.get("ptxas_smem_bytes"), b.get("ptxas_spill_bytes"),
            b.get("ptxas_from", FROM_TRIAL if b.get("ptxas_regs") is not None else None)]


def winners_tables(data: StudyReport) -> str:
    """Per family, a table of the problems it won, one column per knob; a row slower than
    cuBLAS has class 'loss' and says LOSS."""
    out = []
    won = [(p.best or {}).get("family") for p in data.problems]
    for family in [f for f in data.families if f in won]:
        tpl = FAMILIES.get(family)
        knobs = list(tpl.param_names) if tpl else sorted(
            {k for p in data.problems if (p.best or {}).get("family") == family
             for k in p.best["config"]})
        mine = [p for p in data.problems if (p.best or {}).get("family") == family]
        table = table_html(FIXED + knobs + LAUNCH + PTXAS, [_row(data, p, knobs) for p in mine], left=2,
                           cls="winners", row_classes=["loss" if is_loss(ratio_of(p)) else ""
                                                       for p in mine],
                           cell_classes={1: "verdict"})
        out.append(f'<h3>{html.escape(family)}</h3><div class="wide" data-family='
                   f'"{html.escape(family)}">{table}</div>')
    return "".join(out)


def outcomes_table(data: StudyReport) -> str:
    """Outcome counts per problem (every status seen, INVALID included) and trials evaluated."""
    problems = data.problems
    statuses = [s.value for s in Status if any(s.value in p.outcomes for p in problems)]
    return table_html(["problem", *statuses, "evaluated"],
                      [[p.label, *(p.outcomes.get(st, 0) for st in statuses), len(p.trials)]
                       for p in problems], cls="outcomes")
