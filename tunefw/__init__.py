"""tunefw: a distributed autotuner for GPU GEMM kernels.

``tunefw.gemm``, ``tunefw.gated``, ``tunefw.Linear``, ``tunefw.set_dispatch``, ``tunefw.Dispatcher``,
``tunefw.patch`` and ``tunefw.unpatch`` load torch
on first access (the CLI does not pay for them); ``tunefw.SIBLING_SETS`` and
``tunefw.MLP_SIBLING_SETS`` name the layer groups ``patch(fuse=...)`` can fuse.
"""
__version__ = "0.1.0"

_LAZY = {"gemm": "tunefw.runtime.ops", "gated": "tunefw.runtime.ops", "Linear": "tunefw.runtime.ops",
         "set_dispatch": "tunefw.runtime.ops", "get_dispatcher": "tunefw.runtime.ops",
         "Dispatcher": "tunefw.runtime.dispatcher", "patch": "tunefw.runtime.patching",
         "unpatch": "tunefw.runtime.patching", "PatchReport": "tunefw.runtime.patching",
         "SIBLING_SETS": "tunefw.study.siblings", "MLP_SIBLING_SETS": "tunefw.study.siblings"}


def __getattr__(name: str):
    """Runtime names, imported on first use."""
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tunefw' has no attribute {name!r}")
