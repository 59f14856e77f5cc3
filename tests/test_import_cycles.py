"""No import cycles among the suite's modules: every ``import`` counts, including those inside
functions (a lazy import still ties the modules together). Reads the source with ``ast``;
imports nothing."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent



def module_files(package: str = "suite") -> dict[str, Path]:
    files = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def imports_of(name: str, path: Path, modules) -> set[str]:
    """The modules of ``modules`` that ``name`` (at ``path``) imports."""
    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {known(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}".rstrip(".")
            found |= {known(f"{base}.{a.name}") or known(base) for a in node.names}
    return found - {None, name}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def suite_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_cycle_finder_sees_lazy_and_relative_imports(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    (tmp_path / "m.py").write_text("def f():\n    from .pkg import x\n")
    assert imports_of("top.m", tmp_path / "m.py", {"top.pkg", "top.m"}) == {"top.pkg"}


def test_no_import_cycles_in_the_suite():
    found = cycles(suite_graph())
    unknown = found
    assert not unknown, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in unknown)


# What the report may import outside itself: the results on disk, their schema and presets, and
# the registry of providers (names, exactness, styles). The commands that measure or draw
# (runner, frontier, plots, train, kernel, gates, cli, ...) import the report, never the reverse.
REPORT_READS = {"suite.results", "suite.schema", "suite.presets", "suite.catalog",
                "suite.registry"}


def test_the_report_imports_no_command_of_the_suite():
    graph = suite_graph()
    upward = {name: sorted(m for m in graph[name]
                           if not m.startswith("suite.report") and m not in REPORT_READS)
              for name in graph if name == "suite.report" or name.startswith("suite.report.")}
    assert not {k: v for k, v in upward.items() if v}, upward
