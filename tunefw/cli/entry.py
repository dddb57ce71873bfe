"""The `tunefw` command's entry point, kept free of imports: Ctrl-C while the command is still
loading (typer, rich, SQLAlchemy) ends in one line and exit code 130, as it does later, never a
traceback."""
from __future__ import annotations

import sys


def main() -> None:
    """Load the app and run it on the command line's arguments."""
    try:
        from tunefw.cli.app import run
        code = run(sys.argv[1:])
    except KeyboardInterrupt:
        sys.stderr.write("tunefw: interrupted before the command started; nothing was run\n")
        code = 130
    sys.exit(code)
