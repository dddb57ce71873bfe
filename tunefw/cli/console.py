"""The CLI's consoles: tables keep every cell whole outside a terminal (logs, pipes, CI)."""
from __future__ import annotations

import sys

from rich.console import Console

# Outside a terminal rich takes 80 columns and wraps a wider row (or cuts its cells); no row
# tunefw prints comes near this, so each stays one whole line for grep and logs.
PIPE_WIDTH = 100_000


def console(**kwargs) -> Console:
    """A console for stdout, full-width outside a terminal."""
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH, **kwargs)
