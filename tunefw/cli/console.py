"""The CLI's consoles: tables keep every cell whole outside a terminal (logs, pipes, CI)."""
from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 400  # rich cuts tables at 80 columns when stdout is not a terminal


def console(**kwargs) -> Console:
    """A console for stdout, full-width outside a terminal."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH, **kwargs)
