"""Self-contained HTML pages: a study's report (`tunefw report`) and bench results (`tunefw bench`).

Figures are matplotlib SVGs inlined in the page (no external files, no scripts).
"""
from __future__ import annotations

import html
import io
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from tunefw.errors import UserError
from tunefw.fileio import write_atomic
from tunefw.outcome import Status
from tunefw.store import Store
from tunefw.store import queries as q

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f0f0f0}td.l,th.l{text-align:left}code{font-size:12px}
.sim{background:#b00020;color:#fff;padding:.5em 1em;font-weight:bold;font-size:1.2em}"""


# ---- building blocks -------------------------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError("the HTML report needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: smaller pages
    import matplotlib.pyplot as plt
    return plt


def svg(fig: Any) -> str:
    """A matplotlib figure as inline SVG markup (the figure is closed)."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def table_html(header: Sequence[str], rows: Iterable[Sequence[Any]], left: int = 1,
               cls: str = "") -> str:
    """An HTML table; the first ``left`` columns are left-aligned text."""
    align = lambda i: ' class="l"' if i < left else ""  # noqa: E731
    head = "".join(f"<th{align(i)}>{html.escape(str(h))}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{align(i)}>{_cell(v)}</td>" for i, v in enumerate(row))
                   + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, dict):
        return f"<code>{html.escape(json.dumps(value, sort_keys=True))}</code>"
    return html.escape(str(value))


def page(title: str, simulated: bool, sections: Sequence[str]) -> str:
    """A complete HTML document; SIMULATED results carry a banner."""
    banner = ('<p class="sim">SIMULATED: modeled device, not a measurement</p>' if simulated else "")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{banner}"
            + "".join(sections) + "</body></html>\n")


def bars_figure(labels: Sequence[str], series: dict[str, Sequence[float | None]], title: str) -> str:
    """Grouped bars of TFLOP/s per shape, one colour per series."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.legend()
    return svg(fig)


def convergence_figure(curves: dict[str, list[float | None]], title: str) -> str:
    """Best-so-far ratio to cuBLAS (the search's objective) against the evaluated-trial index,
    one line per problem."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, best in curves.items():
        ax.step(range(1, len(best) + 1), [math.nan if b is None else b for b in best],
                where="post", label=name)
    ax.set_xlabel("evaluated trial")
    ax.set_ylabel("best ratio to cuBLAS so far")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return svg(fig)


def fingerprint_html(fingerprint: dict | None) -> str:
    rows = sorted((fingerprint or {}).items())
    return "<h2>Device</h2>" + table_html(("field", "value"), rows, left=2, cls="device")


# ---- the study report ------------------------------------------------------------------------
def best_so_far(trials: Iterable[Any]) -> list[float | None]:
    """Running best ratio to cuBLAS of the OK trials over the evaluated ones (INVALID ones cost
    nothing and are skipped)."""
    best: float | None = None
    out = []
    for t in trials:
        if t.status in (Status.INVALID.value, Status.NOT_RECORDED.value):
            continue
        if t.status == Status.OK.value and t.ratio is not None:
            best = t.ratio if best is None else max(best, t.ratio)
        out.append(best)
    return out


def study_data(store: Store, name: str) -> dict:
    """Everything the report shows, read in one session."""
    with store.session() as s:
        study = q.get_study(s, name)
        problems = []
        for p in study.problems:
            summary = q.problem_summary(s, study, p)  # its best: the winner, else the best ratio
            problems.append({
                "label": f"{p.M}x{p.N}x{p.K} {p.dtype}" + (f" ({p.label})" if p.label else ""),
                "outcomes": summary["outcomes"],
                "curve": best_so_far(q.problem_trials(s, study, p)),
                "best": summary["best"],
            })
        fingerprint = study.fingerprint or next(
            (t.fingerprint for p in study.problems for t in q.problem_trials(s, study, p)
             if t.fingerprint), {})
        simulated = bool((study.stats or {}).get("simulated") or fingerprint.get("simulated"))
        return {"name": study.name, "round": study.round, "problems": problems,
                "fingerprint": fingerprint, "simulated": simulated}


def study_html(data: dict) -> str:
    """The report page of study_data()."""
    sim = " (SIMULATED)" if data["simulated"] else ""
    problems = data["problems"]
    labels = [p["label"] for p in problems]
    best = [p["best"] or {} for p in problems]
    bars = bars_figure(labels, {"tunefw": [b.get("tflops") for b in best],
                                "cuBLAS": [b.get("cublas_tflops") for b in best]},
                       f"best config vs cuBLAS per shape{sim}")
    curves = convergence_figure({p["label"]: p["curve"] for p in problems},
                                f"search convergence{sim}")
    statuses = [s.value for s in Status if any(s.value in p["outcomes"] for p in problems)]
    outcomes = table_html(["problem", *statuses, "evaluated"],
                          [[p["label"], *(p["outcomes"].get(st, 0) for st in statuses),
                            len(p["curve"])] for p in problems], cls="outcomes")
    winners = table_html(
        ["problem", "family", "config", "TFLOP/s", "cuBLAS TFLOP/s", "ratio", "confirmed", "trial"],
        [[p["label"], b.get("family"), b.get("config"), b.get("tflops"), b.get("cublas_tflops"),
          b.get("ratio"), b.get("confirmed"), b.get("trial_id")]
         for p, b in zip(problems, best)], left=3, cls="winners")
    return page(f"tunefw study {data['name']} (round {data['round']})", data["simulated"], [
        "<h2>TFLOP/s per shape</h2>", bars, "<h2>Search convergence</h2>", curves,
        "<h2>Outcomes</h2>", outcomes, "<h2>Winning configs</h2>", winners,
        fingerprint_html(data["fingerprint"])])


def write_report(store: Store, name: str, path: Path) -> dict:
    """Write the study's HTML report to ``path``; returns the data shown."""
    data = study_data(store, name)
    write_atomic(path, study_html(data))
    return data


# ---- bench results ---------------------------------------------------------------------------
def bench_html(result: dict) -> str:
    """The page of a `tunefw bench` result file."""
    rows = result["rows"]
    labels = [f"{r['M']}x{r['N']}x{r['K']} {r['dtype']}" for r in rows]
    series = {"tunefw": [r["tflops"] for r in rows], "cuBLAS": [r["cublas_tflops"] for r in rows]}
    if any(r.get("triton_tflops") for r in rows):
        series["Triton"] = [r.get("triton_tflops") for r in rows]
    simulated = bool(result.get("simulated_table"))
    figure = bars_figure(labels, series, "tunefw runtime vs cuBLAS vs Triton")
    table = table_html(
        ["shape", "path", "family", "tunefw", "cuBLAS", "Triton", "ratio", "Triton ratio",
         "overhead us", "wrong"],
        [[lbl, r["path"], r["family"], r["tflops"], r["cublas_tflops"], r.get("triton_tflops"),
          r["ratio"], r.get("triton_ratio"), r["overhead_us"], r["wrong"]]
         for lbl, r in zip(labels, rows)], left=3, cls="bench")
    geo = result.get("geomean", {})
    summary = f"<p>geomean ratio vs cuBLAS: {_cell(geo.get('ratio'))}; vs Triton: {_cell(geo.get('triton_ratio'))}</p>"
    return page(f"tunefw bench ({result['date']})", simulated,
                ["<h2>TFLOP/s per shape</h2>", figure, summary, table,
                 fingerprint_html(result["device"])])
