"""The project's import graph: no cycles, no import running back up between rooms (a
room: a top-level package, or a module or sub-package of one), at most 7 floors, the
library and the services never importing the tooling, and the runtime never importing a
CLI module.

Every import counts, function-level ones included: a lazy import inside a function hides
a cycle from Python at start-up but not from whoever has to change the code. The graph
is read with `ast`, so nothing is imported (and nothing heavy is loaded) to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specdec", "coordinator", "draft_service", "target_service", "specdec_tools")
PRODUCT = ("specdec", "coordinator", "draft_service", "target_service")
TOOLING = "specdec_tools"
SERVICES = ("draft_service.__main__", "target_service.__main__", "coordinator.__main__",
            "coordinator.deploy.app")
MAX_FLOORS = 7
SKIP = ("specdec.v1",)  # generated protobuf / gRPC code
RUNTIME = "specdec.runtime"
# Command-line front ends; the runtime layer sits below them and must not reach up.
CLI_MODULES = ("specdec.prepare", "specdec.cli", "specdec.client_cli", "specdec.service_cli",
               "specdec.stack", "specdec.launcher", "specdec_tools")


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def is_cli(name: str) -> bool:
    return any(_under(name, m) for m in CLI_MODULES)


def module_files(root: Path, packages=PACKAGES, skip=SKIP) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the given top-level packages."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if not any(_under(name, s) for s in skip):
                out[name] = path
    return out


def imported_names(name: str, path: Path, modules) -> set[str]:
    """Every module `name` imports, anywhere in the file; `from x import y` counts as
    x.y when that is a module, else as x. Relative imports are made absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}" if source else alias.name
                found.add(sub if sub in modules else source)
    return found


def import_graph(root: Path = ROOT, packages=PACKAGES, skip=SKIP):
    """(graph among project modules, every imported name per module)."""
    modules = module_files(root, packages, skip)
    raw = {name: imported_names(name, path, modules) for name, path in modules.items()}
    graph = {name: sorted(m for m in names if m in modules and m != name)
             for name, names in raw.items()}
    return graph, raw


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(graph[start])]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(graph.get(nxt, ())))
    return None


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_sees_the_project(graph):
    edges, _ = graph
    assert "specdec.runtime.models" in edges and "coordinator.api.service" in edges
    assert "specdec.paths" in edges["specdec.runtime.models"]
    assert not any(_under(m, "specdec.v1") for m in edges)


def test_no_import_cycle(graph):
    edges, _ = graph
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_runtime_imports_no_cli_module(graph):
    _, raw = graph
    bad = {name: sorted(m for m in names if is_cli(m))
           for name, names in raw.items() if _under(name, RUNTIME)}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"the runtime imports CLI modules: {bad}"


def test_runtime_reaches_no_cli_module_indirectly(graph):
    edges, _ = graph
    for start in (m for m in edges if _under(m, RUNTIME)):
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges[todo.pop()]:
                assert not is_cli(nxt), f"{start} reaches CLI module {nxt}"
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)


def room(name: str) -> str:
    """The room a module is drawn in: its package's first level ("specdec.runtime.session"
    -> "specdec.runtime", "specdec.metrics" -> itself)."""
    return ".".join(name.split(".")[:2])


def collapse(edges: dict[str, list[str]], key) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for name, targets in edges.items():
        out.setdefault(key(name), set()).update(key(t) for t in targets)
    return {k: sorted(v - {k}) for k, v in out.items()}


def floors(edges: dict[str, list[str]]) -> dict[str, int]:
    """Floor 1 imports nothing of the project; every other stands above all it imports
    (the graph must have no cycle)."""
    out: dict[str, int] = {}

    def floor(n: str) -> int:
        if n not in out:
            out[n] = 1 + max((floor(m) for m in edges.get(n, ())), default=0)
        return out[n]

    for n in edges:
        floor(n)
    return out


def closure(edges: dict[str, list[str]], starts) -> set[str]:
    seen, todo = set(starts), list(starts)
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_import_runs_back_up_between_rooms(graph):
    edges, _ = graph
    for level, key in (("package", lambda n: n.split(".")[0]), ("room", room)):
        rooms = collapse(edges, key)
        cycle = find_cycle(rooms)
        assert cycle is None, f"{level}s import each other: " + " -> ".join(cycle)


def test_at_most_seven_floors(graph):
    edges, _ = graph
    packages = floors(collapse(edges, lambda n: n.split(".")[0]))
    assert max(packages.values()) <= MAX_FLOORS, packages
    for package in PACKAGES:  # the rooms inside each package
        inside = {r: [t for t in ts if t.split(".")[0] == package]
                  for r, ts in collapse(edges, room).items() if r.split(".")[0] == package}
        assert max(floors(inside).values()) <= MAX_FLOORS, (package, floors(inside))


def test_the_library_and_the_services_never_import_the_tooling(graph):
    edges, raw = graph
    bad = {n: sorted(m for m in names if _under(m, TOOLING))
           for n, names in raw.items() if n.split(".")[0] in PRODUCT}
    assert not {k: v for k, v in bad.items() if v}, bad
    reach = closure(edges, SERVICES)
    assert not [m for m in reach if _under(m, TOOLING)]
    assert "specdec.cli" not in reach and "specdec.client_cli" not in reach


# -- the checker itself ----------------------------------------------------------------


def write(root: Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    write(tmp_path, "pkg/__init__.py")
    write(tmp_path, "pkg/a.py", "from pkg import b\n")
    write(tmp_path, "pkg/b.py", "def f():\n    from pkg.sub.c import thing\n")
    write(tmp_path, "pkg/sub/__init__.py")
    write(tmp_path, "pkg/sub/c.py", "def g():\n    from .. import a\n")
    edges, _ = import_graph(tmp_path, ("pkg",), ())
    assert edges["pkg.a"] == ["pkg.b"] and edges["pkg.b"] == ["pkg.sub.c"]
    assert edges["pkg.sub.c"] == ["pkg.a"]
    assert find_cycle(edges) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    write(tmp_path, "pkg/sub/c.py", "import pkg.b as unused\n")
    edges, _ = import_graph(tmp_path, ("pkg",), ())
    assert find_cycle(edges) == ["pkg.b", "pkg.sub.c", "pkg.b"]
    write(tmp_path, "pkg/sub/c.py", "import json\nfrom pkg import sub\n")
    edges, _ = import_graph(tmp_path, ("pkg",), ())
    assert edges["pkg.sub.c"] == ["pkg.sub"] and find_cycle(edges) is None


def test_checker_counts_floors_and_finds_a_room_cycle(tmp_path):
    write(tmp_path, "pkg/__init__.py")
    write(tmp_path, "pkg/a.py", "from pkg.sub import b\n")
    write(tmp_path, "pkg/sub/__init__.py")
    write(tmp_path, "pkg/sub/b.py", "from pkg import c\n")
    write(tmp_path, "pkg/c.py", "")
    edges, _ = import_graph(tmp_path, ("pkg",), ())
    rooms = collapse(edges, room)
    assert floors(rooms) == {"pkg.a": 3, "pkg.sub": 2, "pkg.c": 1, "pkg": 1}
    assert find_cycle(rooms) is None
    write(tmp_path, "pkg/c.py", "def f():\n    from pkg.sub import d\n")
    write(tmp_path, "pkg/sub/d.py", "")  # no module cycle, but the rooms form one
    edges, _ = import_graph(tmp_path, ("pkg",), ())
    assert find_cycle(edges) is None
    assert find_cycle(collapse(edges, room)) == ["pkg.sub", "pkg.c", "pkg.sub"]


def test_cli_names():
    assert is_cli("specdec.prepare") and is_cli("specdec_tools.bench.cli")
    assert is_cli("specdec_tools.bench") and not is_cli("specdec.paths")
    assert not is_cli("specdec.clients") and not is_cli("specdec.stacked")
