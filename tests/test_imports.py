"""Layers only call down: the modules of bench/, tasks/ and models/ import one another without a
cycle, counting the imports inside functions too (a function-local import hides a cycle from
Python's import machinery, not from the design). The graph is built from the source with `ast`,
so nothing is imported to check it."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "tasks", "models")

# Cycles left on purpose, each as the sorted tuple of its modules with the reason. A cycle not
# listed here fails the test; one listed that no longer exists fails it too (so the list shrinks).
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}


def module_files() -> dict[str, Path]:
    """{dotted module name: file} for every module of PACKAGES; a package's `__init__` is the
    package's own name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: set[str]) -> dict[str, int]:
    """{imported module of `modules`: line of its first import} for every `import` and `from …
    import` statement of the file, at any depth (module level, functions, classes, branches).
    `from a import b` is an import of the module a.b where that is a module, else of a; relative
    imports are resolved against the file's package."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int):
        if target in modules and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import a.b.c` binds a but runs a.b.c: the deepest module of ours counts.
                parts = alias.name.split(".")
                for end in range(len(parts), 0, -1):
                    if ".".join(parts[:end]) in modules:
                        add(".".join(parts[:end]), node.lineno)
                        break
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    add(f"{source}.{alias.name}", node.lineno)
                else:
                    add(source, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One shortest cycle through the first module of a component, as the modules in order with
    the first one repeated at the end (breadth-first within the component)."""
    start, members = component[0], set(component)
    parent = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target == start:
                path = [node]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return list(reversed(path)) + [start]
            if target in members and target not in parent:
                parent[target] = node
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    """The component, one shortest cycle in it, and every import between its modules (one of
    which each cycle goes through: what to move)."""
    files = module_files()
    cycle = shortest_cycle(graph, component)
    edges = [f"    {a} → {b}  ({files[a].relative_to(ROOT)}:{graph[a][b]})"
             for a in component for b in sorted(graph[a]) if b in component]
    return (f"cycle among {len(component)} modules: {' → '.join(cycle)}\n"
            f"  imports among {', '.join(component)}:\n" + "\n".join(edges))


def test_the_graph_sees_function_local_and_relative_imports(tmp_path):
    """The reader finds what the cycle check depends on: imports inside functions and methods,
    `from package import submodule`, and relative imports."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("def f():\n    from pkg import b\n    return b\n")
    (package / "b.py").write_text("class C:\n    def g(self):\n        from . import a\n")
    modules = {"pkg", "pkg.a", "pkg.b"}
    assert imports_of("pkg", package / "__init__.py", modules) == {"pkg.a": 1}
    assert imports_of("pkg.a", package / "a.py", modules) == {"pkg.b": 2}
    assert imports_of("pkg.b", package / "b.py", modules) == {"pkg.a": 3}
    graph = {name: imports_of(name, package / (f"{name[4:] or '__init__'}.py"), modules)
             for name in modules}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert shortest_cycle(graph, ["pkg.a", "pkg.b"]) == ["pkg.a", "pkg.b", "pkg.a"]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 40 and "bench.config" in graph and "bench.reports.claims" in graph
    found = {tuple(component): component for component in cycles(graph)}
    new = [describe(graph, component) for key, component in found.items()
           if key not in KNOWN_CYCLES]
    gone = [key for key in KNOWN_CYCLES if key not in found]
    for key in KNOWN_CYCLES.keys() & found.keys():
        print(f"known cycle ({KNOWN_CYCLES[key]}):\n{describe(graph, found[key])}")
    assert not new, "import cycles (layers must only call down):\n" + "\n".join(new)
    assert not gone, f"known cycles no longer there, remove them from KNOWN_CYCLES: {gone}"
