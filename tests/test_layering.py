"""The packages' layering, read from the imports of every product module (no import runs).

- runtime/ (what runs in a replica's sandbox) imports only runtime/, wire/, kernels/ and
  spec/: pool/sandbox.py binds exactly those into every replica;
- pool/ imports neither runtime/ (a replica is a process it starts) nor controlplane/;
- controlplane/ imports no runtime/ module: what it shares with a replica is in spec/;
- poolsim/ (the simulator) imports pool/'s decisions, spec/ and wire/, never runtime/
  or controlplane/; controlplane/ may import it (`thawpool plan`);
- spec/ imports only wire/; wire/ and kernels/ import nothing of the others; nothing
  outside controlplane/ imports controlplane/;
- no cycle between modules through their module-level imports.

Imports inside functions count for the layering (a lazy import still runs in that
process) but not for cycles (they break one on purpose, and say so where they are).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("controlplane", "runtime", "pool", "poolsim", "spec", "wire", "kernels")
ALLOWED = {
    "runtime": {"runtime", "wire", "kernels", "spec"},
    "pool": {"pool", "wire", "kernels", "spec"},
    "poolsim": {"poolsim", "pool", "spec", "wire"},
    "spec": {"spec", "wire"},
    "wire": {"wire"},
    "kernels": {"kernels"},
    "controlplane": {"controlplane", "pool", "poolsim", "wire", "spec", "migrations"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(first-party module, line, at module level) for each import in the file; `from a
    import b` names a.b where that is a module, else a."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node, top in walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.append((child if child in known else node.module, node.lineno, top))
    return sorted((name, line, top) for name, line, top in found if name.split(".")[0] in (*PACKAGES, "migrations"))


def walk(tree: ast.Module):
    """Every node with whether it runs at import: not in a function, not under TYPE_CHECKING."""
    stack = [(node, True) for node in tree.body]
    while stack:
        node, top = stack.pop()
        yield node, top
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
            and not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
        stack += [(child, inner) for child in ast.iter_child_nodes(node)]


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, int, bool]]]:
    modules = product_modules()
    return {name: imports_of(path, set(modules)) for name, path in modules.items()}


def test_each_package_imports_only_what_its_layer_allows(graph):
    wrong = [f"{module}:{line} imports {target}" for module, targets in graph.items()
             for target, line, _ in targets if target.split(".")[0] not in ALLOWED[module.split(".")[0]]]
    assert wrong == []


def test_no_module_level_import_cycle(graph):
    edges = {m: {t for t, _, top in targets if top and t in graph and t != m} for m, targets in graph.items()}
    assert cycles(edges) == []


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_checks_find_a_cycle_and_a_lazy_import(tmp_path):
    """The negative controls: the same functions over a graph and a file that have both."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    probe = tmp_path / "probe.py"
    probe.write_text("import runtime.server\ndef f():\n    from controlplane import app\nimport json\n")
    assert imports_of(probe, {"controlplane.app"}) == [("controlplane.app", 3, False), ("runtime.server", 1, True)]
