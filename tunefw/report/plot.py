"""matplotlib for the report pages: the Agg backend (no display), shared colours, and a figure as
an embedded PNG (a data: URL, so the page stays one file)."""
from __future__ import annotations

import base64
import html
import io
from typing import Any

from tunefw.errors import UserError

TUNEFW = "#1565c0"
CUBLAS = "#616161"
WIN = "#2e7d32"
LOSS = "#c62828"
PARITY = "#212121"
DPI = 110


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a one-line error naming the missing package."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("the HTML report needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def titled(title: str, kind: str | None) -> str:
    """A figure title, with the result's kind (SIMULATED, REPLAY) where it is not a measurement."""
    return f"{title} [{kind}]" if kind else title


def parity(ax: Any, vertical: bool = False) -> None:
    """The 1.0 ratio line (tunefw as fast as cuBLAS)."""
    line = ax.axvline if vertical else ax.axhline
    line(1.0, color=PARITY, linestyle="--", linewidth=1, label="parity with cuBLAS (1.0)")


def png_bytes(fig: Any, title: str, ax: Any = None) -> bytes:
    """Title the figure (``ax``'s title, else the figure's suptitle) and return it as PNG
    bytes; the figure is closed. No timestamp or version metadata: the same data gives the
    same bytes."""
    if ax is None:
        fig.suptitle(title)
    else:
        ax.set_title(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    pyplot().close(fig)
    return buffer.getvalue()


def png_img(fig: Any, title: str, ax: Any = None) -> str:
    """The figure as png_bytes() makes it, in an ``<img>`` (base64) with its title as alt text."""
    data = base64.b64encode(png_bytes(fig, title, ax)).decode("ascii")
    return f'<img class="fig" alt="{html.escape(title)}" src="data:image/png;base64,{data}">'
