"""The shape of the package, drawn from its imports: no import circle, no arrow up a floor, and a
judge whose imports prove it pure (ARCHITECTURE.md draws the same floors).

Every `import kvqual...` counts, at module level or inside a function, but not those under
`if TYPE_CHECKING:` (annotations only: they never run)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kvqual"

# Floors, lowest first: a module may import its own floor or a lower one, never a higher one. Within a
# floor the modules import each other without a circle (checked below). A package listed whole covers
# its submodules; a module listed by name overrides its package's floor.
FLOORS: list[tuple[str, ...]] = [
    ("kvqual", "kvqual.errors", "kvqual.records", "kvqual.provenance", "kvqual.news", "kvqual.stats",
     "kvqual.options", "kvqual.capacity"),                                                          # values, pure maths
    ("kvqual.gate", "kvqual.suites", "kvqual.tokenstore", "kvqual.load.stats"),  # pure policy, what is sent
    ("kvqual.config", "kvqual.store", "kvqual.forced"),                         # config, the files
    ("kvqual.plan", "kvqual.report"),                                           # the seeded order; rendering
    ("kvqual.judge",),                                                          # pure over the files
    ("kvqual.client", "kvqual.retry", "kvqual.bodies", "kvqual.transport", "kvqual.liveness"),  # the transport
    ("kvqual.probe", "kvqual.telemetry", "kvqual.launch", "kvqual.watchdog"),   # what a server is
    ("kvqual.runner", "kvqual.forcing", "kvqual.load.drive", "kvqual.load.summary",
     "kvqual.load.evidence"),                                                   # spending server time
    ("kvqual.commands", "kvqual.compare", "kvqual.load", "kvqual.audit", "kvqual.calibrate"),       # orchestration
    ("kvqual.cli", "kvqual.__main__"),                                          # the shell
]
STANDALONE = "kvqual.serve"  # the reference server: imports nothing of kvqual but itself and suites
SERVE_MAY_IMPORT = ("kvqual.serve", "kvqual.suites")
# what must never be loaded by the judge (nor by `kvqual report`'s judge): a transport, a server
JUDGE_MUST_NOT_LOAD = ("kvqual.client", "kvqual.transport", "kvqual.bodies", "kvqual.retry", "kvqual.liveness",
                       "kvqual.runner",
                       "kvqual.probe", "kvqual.telemetry", "kvqual.launch", "kvqual.forcing", "kvqual.compare",
                       "kvqual.load", "kvqual.serve", "httpx", "aiohttp", "openai")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module → the kvqual modules it imports (a `from pkg import sub` names the submodule)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("kvqual"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                if base.startswith("kvqual"):
                    out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
        edges[name] = {m for m in out if m in mods and m != name}
    return edges


def floor_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the matching prefix, floor)
    for level, names in enumerate(FLOORS):
        for prefix in names:
            if module == prefix or module.startswith(prefix + ".") and prefix != "kvqual":
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), level)
    return None if best is None else best[1]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return imports(_modules())


def test_no_import_circle(graph) -> None:
    assert cycles(graph) == []


def test_every_module_has_a_floor(graph) -> None:
    unplaced = sorted(m for m in graph if floor_of(m) is None and not m.startswith(STANDALONE))
    assert unplaced == []


def test_no_arrow_runs_up_a_floor(graph) -> None:
    up = [f"{a} (floor {floor_of(a)}) -> {b} (floor {floor_of(b)})" for a, targets in sorted(graph.items())
          if not a.startswith(STANDALONE) for b in sorted(targets)
          if not b.startswith(STANDALONE) and floor_of(b) > floor_of(a)]
    assert up == []


def test_the_reference_server_stands_alone(graph) -> None:
    out = sorted(f"{a} -> {b}" for a, targets in graph.items() if a.startswith(STANDALONE)
                 for b in targets if not b.startswith(SERVE_MAY_IMPORT) and b != "kvqual")
    assert out == []


def test_the_checks_see_a_violation() -> None:
    """The checks above can fail: a circle and an upward arrow drawn by hand are found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert floor_of("kvqual.judge.metrics") < floor_of("kvqual.client") < floor_of("kvqual.forcing.teacher")
    assert floor_of("kvqual.load.stats") < floor_of("kvqual.load.drive")


def test_the_judge_loads_no_transport() -> None:
    """Importing the judge (what `kvqual report` runs) loads no transport, no server code, and no
    HTTP library: it is pure over the files by its imports, not by promise."""
    code = ("import sys\nimport kvqual.judge.judge, kvqual.judge.audit, kvqual.report, kvqual.report.console, "
            "kvqual.report.audit\n"
            f"bad = {JUDGE_MUST_NOT_LOAD!r}\n"
            "print('\\n'.join(sorted(m for m in sys.modules if any(m == b or m.startswith(b + '.') for b in bad))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
    # and the check would see one: the compare flow loads the transport
    code_flow = code.replace("import kvqual.judge.judge,", "import kvqual.compare.flow, kvqual.judge.judge,")
    loaded = subprocess.run([sys.executable, "-c", code_flow], capture_output=True, text=True, check=True).stdout.split()
    assert "kvqual.client" in loaded and "kvqual.forcing.teacher" in loaded
