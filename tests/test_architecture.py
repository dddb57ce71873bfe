"""The package's shape: no import cycle among tunefw modules, no module over the line limit, and
every import goes down the layers (a layer uses the ones below it, never one above)."""
from __future__ import annotations

import ast

from conftest import REPO

PACKAGE = REPO / "tunefw"
MAX_LINES = 400
# Lowest first. The top-level modules not in a folder are the vocabulary every layer shares.
LAYERS = [
    ("vocabulary", ("tunefw.errors", "tunefw.fileio", "tunefw.framing", "tunefw.problem",
                    "tunefw.device", "tunefw.outcome")),
    ("database", ("tunefw.store",)),  # rows and queries: no study file, no search
    ("kernel families", ("tunefw.templates",)),
    ("CUDA compiler and driver", ("tunefw.cuda", "tunefw.cuda.compiler")),
    ("study files", ("tunefw.study",)),
    ("evaluators", ("tunefw.evaluate",)),
    ("serving", ("tunefw.runtime",)),
    ("search", ("tunefw.tune",)),
    ("measuring", ("tunefw.measure", "tunefw.measure.roofline")),
    ("exporting", ("tunefw.export",)),
    ("report", ("tunefw.report",)),
    ("command line", ("tunefw.cli", "tunefw.__main__")),
]


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text())
    return out


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The tunefw modules a module imports at run time (function-level imports included,
    ``if TYPE_CHECKING:`` blocks left out); ``from P import m`` of a module m names m."""
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING"
                   for n in ast.walk(block)}
    deps = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tunefw"):
            named = {f"{node.module}.{a.name}" for a in node.names} & modules
            deps |= named or {node.module}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.startswith("tunefw")}
    return deps & modules


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(tree, set(modules)) for name, tree in modules.items()}


def _layer(module: str) -> int | None:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_no_import_cycle_among_tunefw_modules():
    graph = _graph()
    cycles, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [module, dep])
            elif dep not in state:
                visit(dep, stack + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == []
    assert "tunefw.tune.search" not in graph["tunefw.tune.sampler_host"]


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(REPO)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_module_has_a_layer_and_imports_only_its_own_and_lower_ones():
    graph = _graph()
    unplaced = sorted(m for m in graph if m != "tunefw" and _layer(m) is None)
    assert unplaced == [], "place new folders in LAYERS"
    upward = sorted(f"{m} ({LAYERS[_layer(m)][0]}) imports {d} ({LAYERS[_layer(d)][0]})"
                    for m, deps in graph.items() if m != "tunefw"  # the lazy public API
                    for d in deps if _layer(d) > _layer(m))
    assert upward == []

