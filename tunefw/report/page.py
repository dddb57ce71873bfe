"""HTML building blocks of the report pages: tables, sections, the labelled banner, the document.

Everything is inline (styles, images as data: URLs): a page opens offline, from a mail or a
CI artifact, with nothing to fetch.
"""
from __future__ import annotations

import html
import json
from typing import Any, Iterable, Sequence

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}
table.winners{font-size:12px}table.winners th{font-size:11px}
th{background:#f0f0f0}td.l,th.l{text-align:left;white-space:nowrap}code{font-size:12px}
tr.loss td{background:#fde4e4}tr.loss td.verdict{color:#b00020;font-weight:bold}
td.verdict{color:#1b5e20}p.note{color:#555;font-size:13px;max-width:1000px}
div.wide{overflow-x:auto}img.fig{display:block;max-width:100%;margin:.5em 0 1.5em}
.kind{background:#b00020;color:#fff;padding:.5em 1em;font-weight:bold;font-size:1.2em}"""

# What each kind of non-measured result is, for its banner.
KIND_TEXT = {
    "SIMULATED": "SIMULATED: modeled device, not a measurement",
    "REPLAY": "REPLAY: answers looked up in recorded sweeps, not measured by this launch",
}


def cell(value: Any) -> str:
    """One table cell's HTML: None as '-', floats to 3 significant digits (1 decimal from 10)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, dict):
        return f"<code>{html.escape(json.dumps(value, sort_keys=True))}</code>"
    return html.escape(str(value))


def table_html(header: Sequence[str], rows: Iterable[Sequence[Any]], left: int = 1,
               cls: str = "", row_classes: Sequence[str] | None = None,
               cell_classes: dict[int, str] | None = None) -> str:
    """An HTML table; the first ``left`` columns are left-aligned text, ``row_classes`` gives
    each body row a class (e.g. 'loss'), ``cell_classes`` a class per column index."""
    def attrs(i: int) -> str:
        names = ["l"] if i < left else []
        if cell_classes and i in cell_classes:
            names.append(cell_classes[i])
        return f' class="{" ".join(names)}"' if names else ""

    head = "".join(f"<th{attrs(i)}>{html.escape(str(h))}</th>" for i, h in enumerate(header))
    body = []
    for n, row in enumerate(rows):
        row_cls = row_classes[n] if row_classes and row_classes[n] else ""
        tr = f'<tr class="{row_cls}">' if row_cls else "<tr>"
        body.append(tr + "".join(f"<td{attrs(i)}>{cell(v)}</td>" for i, v in enumerate(row))
                    + "</tr>")
    return (f'<table class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def section(anchor: str, title: str, *parts: str) -> str:
    """A titled section (``<h2 id=anchor>``) holding already-rendered parts."""
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{"".join(parts)}</section>'


def note(text: str) -> str:
    """A short explanatory paragraph under a figure or table (plain text, escaped)."""
    return f'<p class="note">{html.escape(text)}</p>'


def fingerprint_html(fingerprint: dict | None) -> str:
    """The device fingerprint as a two-column table."""
    rows = sorted((fingerprint or {}).items())
    return section("device", "Device", table_html(("field", "value"), rows, left=2, cls="device"))


def page(title: str, kind: str | None, sections: Sequence[str]) -> str:
    """A complete HTML document; a SIMULATED or REPLAY result carries a banner saying so."""
    banner = f'<p class="kind">{html.escape(KIND_TEXT[kind])}</p>' if kind else ""
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{banner}"
            + "".join(sections) + "</body></html>\n")
