"""How a launch stops: SIGTERM is delivered like Ctrl-C (one line, resumable), whoever else
(Ray's driver) installed a handler before; and either signal waits while the main thread is
inside a database write (``deferred``), so that the stop never lands between a transaction's
statements (a transaction cut there can keep SQLite's write lock past the launch lease's
release) but right after it commits or rolls back."""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_state = {"terminated": False, "installed": False, "deferring": 0, "pending": False}


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGTERM:
        _state["terminated"] = True
    if _state["deferring"]:
        _state["pending"] = True  # raised when the write in progress is over
        return
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Make SIGTERM (and Ctrl-C) raise KeyboardInterrupt in the main thread, held back inside
    ``deferred`` (a no-op off the main thread)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        _state["installed"] = True


@contextmanager
def deferred() -> Iterator[None]:
    """Hold a Ctrl-C or SIGTERM that arrives inside the block until the block is over, then
    raise it (on the main thread, once the handlers are installed; elsewhere a plain block)."""
    if not _state["installed"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        if not _state["deferring"] and _state["pending"]:
            _state["pending"] = False
            raise KeyboardInterrupt


def terminated() -> bool:
    """True once a SIGTERM arrived through this handler."""
    return _state["terminated"]
