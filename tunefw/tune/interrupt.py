"""SIGTERM delivered like Ctrl-C: the launch stops cleanly (one line, resumable), whoever else
(Ray's driver) installed a handler before."""
from __future__ import annotations

import signal
import threading
from types import FrameType

_state = {"terminated": False}


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _state["terminated"] = True
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt in the main thread (a no-op off the main thread)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def terminated() -> bool:
    """True once a SIGTERM arrived through this handler."""
    return _state["terminated"]
