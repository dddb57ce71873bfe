"""`tunefw bench --html`: the page of a bench result (tunefw's runtime path against cuBLAS and
Triton per dispatch entry)."""
from __future__ import annotations

from typing import Sequence

from tunefw.problem import problem_text
from tunefw.report.page import cell, fingerprint_html, page, table_html
from tunefw.report.plot import png_img, pyplot


def bars_figure(labels: Sequence[str], series: dict[str, Sequence[float | None]], title: str) -> str:
    """Grouped bars of TFLOP/s per shape, one colour per series."""
    fig, ax = pyplot().subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4),
                                layout="constrained")
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.legend()
    return png_img(fig, title, ax)


def bench_html(result: dict) -> str:
    """The page of a `tunefw bench` result file."""
    rows = result["rows"]
    labels = [problem_text(r) for r in rows]
    series = {"tunefw": [r["tflops"] for r in rows], "cuBLAS": [r["cublas_tflops"] for r in rows]}
    if any(r.get("triton_tflops") for r in rows):
        series["Triton"] = [r.get("triton_tflops") for r in rows]
    kind = "SIMULATED" if result.get("simulated_table") else None
    figure = bars_figure(labels, series, "tunefw runtime vs cuBLAS vs Triton")
    table = table_html(
        ["shape", "path", "family", "tunefw", "cuBLAS", "Triton", "ratio", "Triton ratio",
         "overhead us", "wrong"],
        [[lbl, r["path"], r["family"], r["tflops"], r["cublas_tflops"], r.get("triton_tflops"),
          r["ratio"], r.get("triton_ratio"), r["overhead_us"], r["wrong"]]
         for lbl, r in zip(labels, rows)], left=3, cls="bench")
    geo = result.get("geomean", {})
    summary = (f"<p>geomean ratio vs cuBLAS: {cell(geo.get('ratio'))}; "
               f"vs Triton: {cell(geo.get('triton_ratio'))}</p>")
    return page(f"tunefw bench ({result['date']})", kind,
                ["<h2>TFLOP/s per shape</h2>", figure, summary, table,
                 fingerprint_html(result["device"])])
