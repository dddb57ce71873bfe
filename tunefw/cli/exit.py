"""How the `tunefw` command ends: every error one line on stderr with its exit code (usage 2,
bad input 1, internal 3, Ctrl-C 130, SIGTERM 143, also when the stop cut a database call whose
cleanup failed in turn); tracebacks only with TUNEFW_DEBUG=1."""
from __future__ import annotations

import os
from typing import Any

from rich.console import Console

from tunefw.errors import UserError
from tunefw.tune.interrupt import terminated

try:  # typer >= 0.20 carries its own copy of click
    from typer._click import exceptions as _click_exc
    from typer.exceptions import Abort as _Abort, Exit as _Exit
except ImportError:  # older typer runs on click itself
    from click import exceptions as _click_exc
    from click.exceptions import Abort as _Abort, Exit as _Exit


def interrupted(err: Console) -> int:
    """The one line of a stopped launch; the exit code says Ctrl-C (130) or SIGTERM (143)."""
    by_sigterm = terminated()
    why = "terminated (SIGTERM)" if by_sigterm else "interrupted"
    err.print(f"tunefw: {why}; trials in flight were discarded, launch again to resume",
              markup=False)
    return 143 if by_sigterm else 130


def stopped_inside(exc: BaseException) -> bool:
    """Whether a Ctrl-C or SIGTERM is what ``exc`` unwound from: the stop landed inside a
    database call (a read, or a library's own write) and the cleanup of the cut connection
    raised in turn (psycopg: "can't change 'autocommit' now ... ACTIVE")."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def run_command(command: Any, args: list[str], err: Console) -> int:
    """Run a click command without standalone mode and map each way it ends to an exit code."""
    try:
        # Without standalone mode typer returns (not raises) the code of an Exit, and turns
        # Ctrl-C into Exit(130).
        code = command.main(args=args, prog_name="tunefw", standalone_mode=False)
        if code == 130:
            return interrupted(err)
        return code if isinstance(code, int) else 0
    except _Exit as exc:
        return interrupted(err) if exc.exit_code == 130 else exc.exit_code
    except _click_exc.UsageError as exc:
        if exc.ctx is not None and type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.ctx.get_help())
            return 0
        where = exc.ctx.command_path if exc.ctx else "tunefw"
        err.print(f"{where}: error: {exc.format_message()}", markup=False)
        return 2
    except _click_exc.ClickException as exc:
        err.print(f"tunefw: error: {exc.format_message()}", markup=False)
        return exc.exit_code
    except (_Abort, KeyboardInterrupt):
        return interrupted(err)
    except UserError as exc:
        err.print(f"tunefw: error: {exc}", markup=False)
        return 1
    except Exception as exc:  # a bug, not bad input: one line unless asked for the traceback
        if stopped_inside(exc):
            return interrupted(err)
        if os.environ.get("TUNEFW_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        err.print(f"tunefw: internal error: {type(exc).__name__}: {first} "
                  "(TUNEFW_DEBUG=1 shows the traceback)", markup=False)
        return 3
