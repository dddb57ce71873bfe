"""The package's shape: no import cycle among tunefw modules, no module over the line limit,
every import goes down the layers (a layer uses the ones below it, never one above), only the
shared core outside a folder, and CUDA driver calls in tunefw/cuda/ alone."""
from __future__ import annotations

import ast
import re

from conftest import REPO

PACKAGE = REPO / "tunefw"
MAX_LINES = 400
# The modules outside a folder: the shared core, each used by layers that sit in different
# folders, so it can live in none of them.
SHARED_CORE = (
    "tunefw.errors",   # UserError: raised in every layer, one line at the command line
    "tunefw.problem",  # GemmProblem: kernel checks, rows, evaluators, dispatch, CLI
    "tunefw.device",   # DeviceSpec: templates' checks (below tunefw/cuda/, which fills it), runtime
    "tunefw.outcome",  # Status, Outcome, TrialSpec: made by cuda/ and evaluate/, stored by store/
    "tunefw.framing",  # helper processes' pipe protocol: cuda/'s compilers, tune/'s sampler host
)
# Lowest first.
LAYERS = [
    ("shared core", SHARED_CORE),
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



def test_only_the_shared_core_lies_outside_a_folder():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert [f"tunefw.{m}" for m in top] == sorted(SHARED_CORE)


# Modules that may call cuda.bindings' driver API besides tunefw/cuda/: the runtime's hot launch
# (plan.py: cuLaunchKernel without a Python layer between) and wgmma_sm90's TMA descriptors (its
# kernel arguments are CUtensorMaps).
DRIVER_OUTSIDE_CUDA = {"tunefw/runtime/plan.py", "tunefw/templates/wgmma_sm90.py"}
_BINDINGS = re.compile(r"^\s*(from cuda\.bindings\b|from cuda import|import cuda\.bindings)", re.M)


def test_cuda_driver_code_lives_in_tunefw_cuda_and_no_script_has_its_own():
    users = {str(p.relative_to(REPO)) for folder in ("tunefw", "benchmarks")
             for p in (REPO / folder).rglob("*.py") if _BINDINGS.search(p.read_text())}
    outside = {u for u in users if not u.startswith("tunefw/cuda/")}
    assert outside == DRIVER_OUTSIDE_CUDA
