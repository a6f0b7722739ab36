"""Layers only call down: the modules of bench/, tasks/ and models/ import one another without a
cycle, counting the imports inside functions too (a function-local import hides a cycle from
Python's import machinery, not from the design); bench/'s folders import only the folders below
them (LAYERS); and an import inside a function is there for a stated reason. The graph is built from the source with `ast`,
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


# --- the folders of bench/ are layers ---------------------------------------------------------

# Lowest first. A module imports only modules of its own folder or of a folder listed before
# its own; folders on one line are siblings and import neither each other. tasks/ and models/
# sit below all of them and import nothing of bench/.
LAYERS: list[tuple[str, ...]] = [
    ("bench.config",),  # torch-free: compose a run's config, the command grammar, formats
    ("bench.records",),  # the run record: schema, writing, reading, provenance
    ("bench.training",),  # one run: build, train, evaluate, write
    ("bench.reports", "bench.perf"),  # read records / measure speed and the GPU path
    ("bench.cli",),  # the command line and the suite runner
    ("bench.__main__",),
]


def folder_of(module: str) -> str | None:
    """The LAYERS folder a module belongs to (None: tasks, models, the bench package itself)."""
    for layer in LAYERS:
        for folder in layer:
            if module == folder or module.startswith(folder + "."):
                return folder
    return None


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    level = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
    found = []
    files = module_files()
    for module, targets in sorted(graph.items()):
        here = folder_of(module)
        for target, line in sorted(targets.items()):
            there = folder_of(target)
            where = f"{files[module].relative_to(ROOT)}:{line}"
            if module.split(".")[0] in ("tasks", "models") and target.split(".")[0] == "bench":
                found.append(f"{where}: {module} imports {target} (tasks/ and models/ know "
                             "nothing of bench/)")
            elif here is None or there is None or here == there:
                continue
            elif level[there] >= level[here]:
                found.append(f"{where}: {module} ({here}) imports {target} ({there}), "
                             "a layer " + ("beside" if level[there] == level[here] else "above"))
    return found


def test_every_module_of_bench_is_in_a_folder_of_the_layers():
    """bench/ holds its folders (and the package's __init__ and __main__), no loose module, so
    the layer test sees every module."""
    loose = [name for name in module_files() if name.startswith("bench.")
             and folder_of(name) is None and not name.startswith("bench.conf")]
    assert not loose, f"modules of bench/ outside the folders of LAYERS: {loose}"


def test_the_folders_only_call_down():
    problems = layer_violations(import_graph())
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_the_layer_check_sees_an_import_upwards():
    graph = {"bench.training.train": {"bench.reports.leaderboard": 7},
             "bench.reports.plot": {"bench.perf.speed": 3, "bench.training.train": 4},
             "tasks.markov": {"bench.config": 1}}
    real = module_files()
    problems = [p.split(": ", 1)[1] for p in layer_violations({k: v for k, v in graph.items()
                                                                if k in real})]
    assert problems == [
        "bench.reports.plot (bench.reports) imports bench.perf.speed (bench.perf), a layer beside",
        "bench.training.train (bench.training) imports bench.reports.leaderboard "
        "(bench.reports), a layer above",
        "tasks.markov imports bench.config (tasks/ and models/ know nothing of bench/)"]


# --- imports inside functions ---------------------------------------------------------------

# The modules that may import inside a function, each with its reason; every other module imports
# at its top. A module listed that no longer needs it fails the test too (the list shrinks).
START_UP = ("start-up: the command line answers a mistyped argument before torch, Lightning and "
            "the families load (~0.2 s of CPU instead of 3-7 s, README 'What a command costs')")
TORCH_FREE = ("a torch-free module of the command line or the reports (leaderboard, plot and "
              "compare start without torch): torch loads in the functions that compute with it")
OPTIONAL = ("a dependency one feature needs (optional, or seconds to import), loaded only where "
            "that feature is used")
FUNCTION_LOCAL_IMPORTS = {
    "bench/cli/main.py": START_UP,
    "bench/cli/run_commands.py": START_UP,
    "bench/cli/report_commands.py": START_UP,
    "bench/cli/suites.py": START_UP,
    "bench/cli/launch.py": START_UP + "; submitit, an optional dependency, for launcher=slurm",
    "bench/cli/worker.py": "after the worker's environment is set, as bench/cli/main.py does",
    "bench/perf/gpucheck/driver.py": START_UP + " (a bad option is refused before torch loads)",
    "bench/records/store.py": TORCH_FREE,
    "bench/reports/identities.py": TORCH_FREE,
    "bench/reports/plot.py": TORCH_FREE + "; matplotlib (0.5 s) loads when a figure is drawn",
    "tasks/stats.py": TORCH_FREE,
    "tasks/configs.py": TORCH_FREE,
    "tasks/__init__.py": "the light registry: a family's module (and torch) loads when used",
    "models/__init__.py": "the light registry: a family's module (and torch) loads when used",
    "bench/reports/identity.py": ("runs as a script inside old checkouts: it imports the "
                                  "checkout's own packages, and only what that checkout has"),
    "bench/perf/kernel_parity.py": OPTIONAL + " (triton, mamba_ssm)",
    "bench/perf/triton_compile_cost.py": OPTIONAL + " (triton, mamba_ssm; a script run "
                                         "under TRITON_INTERPRET, set before triton loads)",
    "models/ssd.py": OPTIONAL + " (mamba_ssm's kernel)",
    "bench/training/runlog.py": OPTIONAL + " (tensorboard)",
    "bench/training/memory.py": "torch's FakeTensorMode, needed only for the memory estimate",
    "tasks/text.py": OPTIONAL + " (datasets; pydoc_data's texts)",
    "tasks/corpora/sources.py": OPTIONAL + " (datasets, pyarrow, huggingface_hub)",
    "tasks/corpora/tokenizers.py": OPTIONAL + " (tokenizers, huggingface_hub)",
    "tasks/corpora/token_cache.py": OPTIONAL + " (pyarrow, tqdm)",
    "bench/reports/export.py": OPTIONAL + " (pyarrow, for a .parquet table)",
    "bench/__main__.py": "Ctrl-C while the command line imports: one line, no traceback",
}


def function_local_imports() -> dict[str, list[int]]:
    """{file: lines of its import statements inside a function} over bench/, tasks/, models/."""
    found: dict[str, list[int]] = {}
    for path in module_files().values():
        lines = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines.update(inner.lineno for inner in ast.walk(node)
                             if isinstance(inner, (ast.Import, ast.ImportFrom)))
        if lines:
            found[path.relative_to(ROOT).as_posix()] = sorted(lines)
    return found


def test_imports_inside_functions_have_a_stated_reason():
    found = function_local_imports()
    for path, reason in FUNCTION_LOCAL_IMPORTS.items():
        print(f"{path}: {len(found.get(path, []))} ({reason})")
    unexplained = {path: lines for path, lines in found.items()
                   if path not in FUNCTION_LOCAL_IMPORTS}
    gone = [path for path in FUNCTION_LOCAL_IMPORTS if path not in found]
    assert not unexplained, ("imports inside functions without a reason (import at the top, "
                             f"or add the module and why to FUNCTION_LOCAL_IMPORTS): {unexplained}")
    assert not gone, f"no longer import inside a function, remove them: {gone}"
