"""The tree keeps its layer order (docs/architecture.md): a layer imports only layers below it, and no
module imports itself back through others.

Every ``import`` in every module counts, wherever it stands: at module level, inside a function (a
deferred import is still a dependency) and under ``if TYPE_CHECKING:`` (an annotation naming an upper
layer still ties the lower one to it). Cycles are looked for twice: among the imports that run (module
and function level), and among all of them, type-only ones included: two modules that name each
other's types are one concept split in two, or miss a small protocol (``launch/seam.py``'s
``GroupLoop`` is what a rank group needs of the loop, so it does not name ``launch/loop.py``).

The order is declared once, in ``LAYERS``; ``KNOWN`` lists each import that breaks a rule today and
waits on a file move, with the reason. A known exception that no longer occurs fails too, so the
table shrinks as the moves land.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nbaccel"

# Top to bottom. Modules in one row may import each other (no cycles); a module imports only rows
# below its own. A name matches a module and everything under it.
LAYERS: list[tuple[str, ...]] = [
    ("nbaccel",),  # __init__.py: the lazy public face over everything
    ("nbaccel.notebook",),
    ("nbaccel.launcher", "nbaccel.testing"),
    ("nbaccel.cluster",),  # the kernel side of several machines
    ("nbaccel.agent",),  # the node side: never imported by the kernel side (test below)
    ("nbaccel.pool",),
    ("nbaccel.output",),
    ("nbaccel.launch",),
    ("nbaccel.rank",),
    ("nbaccel.state",),
    ("nbaccel.wire",),
    ("nbaccel.net",),  # the signed link, both sides of several machines: stdlib only
    ("nbaccel.devices",),  # stdlib and errors only: what a machine's accelerators are
    ("nbaccel.errors", "nbaccel._version"),
]

# The data that crosses the fork (a Job and the child's pipe ends) lives in wire/job.py, which both
# sides import; the kernel side must not reach into the rank's bootstrap for it.
FORK_DATA = ("nbaccel.rank.bootstrap", frozenset({"Job", "ChildEnds"}))
RANK_SIDE = ("nbaccel.rank.",)  # modules that run in the rank: all under rank/
FORK_DATA_REASON = "Job/ChildEnds live in nbaccel/wire/job.py: import them from there"
KNOWN_FORK_DATA_IMPORTERS: frozenset[str] = frozenset()


# (importer, imported): an upward import waiting on a file move, with its reason. Empty today.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str  # the module (a package's __init__ for `from package import name` of a module-less name)
    names: tuple[str, ...]
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        where = " (type-only)" if self.type_only else ""
        return f"{self.importer}:{self.line} imports {self.imported}{where}"


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, package: str, modules: dict[str, Path]) -> None:
        self.module, self.package, self.modules = module, package, modules
        self.found: list[Import] = []
        self._type_only = 0

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._type_only += 1
            for child in node.body:
                self.visit(child)
            self._type_only -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, (), node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            base = ".".join([*parts, base] if base else parts)
        plain = [a.name for a in node.names if f"{base}.{a.name}" not in self.modules]
        for alias in node.names:
            if f"{base}.{alias.name}" in self.modules:  # `from nbaccel.launch import warm`: the module warm
                self._add(f"{base}.{alias.name}", (), node.lineno)
        if plain:
            self._add(base, tuple(plain), node.lineno)

    def _add(self, imported: str, names: tuple[str, ...], line: int) -> None:
        if imported == "nbaccel" or imported.startswith("nbaccel."):
            self.found.append(Import(self.module, imported, names, line, self._type_only > 0))


def all_imports() -> Iterator[Import]:
    modules = module_names()
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        visitor = _Imports(module, package, modules)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        yield from visitor.found


def layer_of(module: str) -> int:
    """The row of LAYERS a module belongs to: the longest matching name wins."""
    best, row = -1, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, row = len(name), index
    assert row >= 0, f"{module} is in no layer of LAYERS: add it to the table (and to docs/architecture.md)"
    return row


def test_every_module_has_a_layer() -> None:
    for module in module_names():
        layer_of(module)


def test_no_import_points_up() -> None:
    upward = [i for i in all_imports() if layer_of(i.imported) < layer_of(i.importer)]
    unexpected = [str(i) for i in upward if (i.importer, i.imported) not in KNOWN_UPWARD]
    assert not unexpected, "imports against the layer order (docs/architecture.md):\n  " + "\n  ".join(unexpected)
    stale = [f"{a} -> {b}" for a, b in KNOWN_UPWARD if (a, b) not in {(i.importer, i.imported) for i in upward}]
    assert not stale, "known exceptions that no longer occur (remove them from KNOWN_UPWARD):\n  " + "\n  ".join(stale)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
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
    return found


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for i in all_imports():
        if not i.type_only and i.imported != i.importer:
            graph.setdefault(i.importer, set()).add(i.imported)
    cycles = _cycles(graph)
    assert not cycles, "import cycles (module- and function-level imports alike):\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_no_type_level_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for i in all_imports():
        if i.imported != i.importer:
            graph.setdefault(i.importer, set()).add(i.imported)
    cycles = _cycles(graph)
    assert not cycles, "import cycles through annotations (if TYPE_CHECKING: imports included); name a protocol instead:\n  " + "\n  ".join(
        " <-> ".join(c) for c in cycles
    )


def test_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a three-module ring is found, a chain is not."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}}) == []


def test_fork_data_importers_are_the_known_ones() -> None:
    module, names = FORK_DATA
    importers = {i.importer for i in all_imports() if i.imported == module and names & set(i.names) and not i.importer.startswith(RANK_SIDE)}
    new = sorted(importers - KNOWN_FORK_DATA_IMPORTERS)
    assert not new, f"new kernel-side imports of {sorted(names)} from {module} ({FORK_DATA_REASON}): {new}"
    stale = sorted(KNOWN_FORK_DATA_IMPORTERS - importers)
    assert not stale, f"no longer import {sorted(names)} from {module}: remove them from KNOWN_FORK_DATA_IMPORTERS: {stale}"


# What the kernel side (and a node agent, the kernel of its node's ranks) takes from the rank side:
# only the function a starter runs in the new process, as a Job or a process's main (as
# launch/starters/fork.py takes run_rank). Data that crosses the fork lives in wire/ (Job,
# RankCall and RankCode calls, the stack files, a sharded pull's layout, the exit timeout).
STARTING_SIDE = (
    "nbaccel.notebook",
    "nbaccel.launcher",
    "nbaccel.testing",
    "nbaccel.cluster",
    "nbaccel.agent",
    "nbaccel.pool",
    "nbaccel.output",
    "nbaccel.launch",
)
ENTRY_POINTS: dict[str, frozenset[str]] = {
    "nbaccel.rank.serve": frozenset({"serve"}),  # a persistent worker's Job (pool/pool.py)
    # a forked rank's main, and what the fork starter prepares for it in the parent, before the fork
    "nbaccel.rank.bootstrap": frozenset({"run_rank", "prepare_environment", "PreparedEnvironment", "rank_names"}),
    "nbaccel.rank.server_loop": frozenset({"serve"}),  # the fork server process's main
    "nbaccel.rank.agent_entry": frozenset({"remote_job"}),  # the Job of a rank a node agent forks
}

# (importer, imported): a starting-side module that still takes rank-side code, and why it must.
_TITLES = (
    "a node agent names its own process with the code that names a rank and the fork server (prctl, the argument area found "
    "once at import, which a fork keeps): one module for every nbaccel process's name, code run in the process it names, not data"
)
_PREPARED = (
    "the fork starter builds, in the parent and right before the fork, what the rank's own code would make (its names encoded "
    "as the rank writes them, its stack dump file opened as the rank's faulthandler uses it): fewer pages a rank copies; the "
    "format is the rank code's own, so it is made by that code, not copied into wire/"
)
KNOWN_STARTING_SIDE_RANK_IMPORTS: dict[tuple[str, str], str] = {
    ("nbaccel.agent.cli", "nbaccel.rank.process_title"): _TITLES,
    ("nbaccel.agent.node", "nbaccel.rank.process_title"): _TITLES,
    ("nbaccel.launch.starters.fork", "nbaccel.rank.process_title"): _PREPARED,
    ("nbaccel.launch.starters.fork", "nbaccel.rank.stack_dump"): _PREPARED,
}


def test_the_starting_side_takes_from_the_rank_side_only_entry_points() -> None:
    taken = [i for i in all_imports() if i.importer.startswith(STARTING_SIDE) and i.imported.startswith("nbaccel.rank")]
    wrong = [i for i in taken if not i.names or not set(i.names) <= ENTRY_POINTS.get(i.imported, frozenset())]
    unknown = [f"{i} {list(i.names)}" for i in wrong if (i.importer, i.imported) not in KNOWN_STARTING_SIDE_RANK_IMPORTS]
    assert not unknown, (
        "the kernel side imports rank-side modules for what crosses the fork (give it a home in nbaccel/wire/, or send the rank's code as a "
        "wire.rank_calls.RankCode):\n  " + "\n  ".join(unknown)
    )
    stale = [f"{a} -> {b}" for a, b in KNOWN_STARTING_SIDE_RANK_IMPORTS if (a, b) not in {(i.importer, i.imported) for i in wrong}]
    assert not stale, "known exceptions that no longer occur (remove them from KNOWN_STARTING_SIDE_RANK_IMPORTS):\n  " + "\n  ".join(stale)


def test_errors_imports_no_layer() -> None:
    """errors.py is imported by every layer, so it imports none (not even for annotations)."""
    assert [str(i) for i in all_imports() if i.importer == "nbaccel.errors"] == []


# Ray places an actor by its class, so the Ray starter names the node side's actor class; that
# module imports only the standard library (checked below): none of the agent's machinery loads.
NAMED_FOR_RAY = {("nbaccel.cluster.starters.ray", "nbaccel.agent.ray_actor")}


def test_the_ray_actor_module_the_kernel_names_imports_only_the_standard_library() -> None:
    imported = [i.imported for i in all_imports() if i.importer == "nbaccel.agent.ray_actor"]
    assert all(not name.startswith("nbaccel") for name in imported), imported


def test_the_kernel_side_of_several_machines_never_imports_the_node_side() -> None:
    """nbaccel.cluster runs in the kernel and nbaccel.agent on the nodes: what both need is in
    nbaccel.net (the link) or lower, so neither side's code is loaded where it does not run."""
    crossing = [
        str(i)
        for i in all_imports()
        if i.importer.startswith("nbaccel.cluster") and i.imported.startswith("nbaccel.agent") and (i.importer, i.imported) not in NAMED_FOR_RAY
    ]
    assert not crossing, "the kernel side imports the node side:\n  " + "\n  ".join(crossing)


def test_the_map_in_docs_lists_the_layers_in_this_order() -> None:
    """docs/architecture.md's table of folders goes down the layers as LAYERS does (a reader takes
    the map's order for the import order)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    folders = [line.split("`")[1].strip("/").replace("/", ".") for line in text.splitlines() if line.startswith("| `nbaccel/")]
    packages = [name for row in LAYERS for name in row if (PACKAGE / name.removeprefix("nbaccel.")).is_dir() and name != "nbaccel"]
    assert folders == packages, f"docs/architecture.md lists {folders}; the layers, top down, are {packages}"
