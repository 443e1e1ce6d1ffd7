"""nbaccel uses torch's public API only: no private attribute, module or name of torch anywhere in nbaccel/.

A private name (``torch._C``, ``c10d._update_default_pg``, elastic's ``_pc``) can change in any torch
release without notice, and then several machines break at once, or silently. The check reads each
module's syntax tree (comments and docstrings may name private things; code may not):

- an attribute chain rooted at a name bound to torch (``import torch``, ``import torch.distributed as
  dist``, ``from torch.x import y``, ``x = sys.modules.get("torch.x")``, an assignment from one of
  those) with a component that starts with ``_`` (dunders aside);
- ``getattr``/``hasattr``/``setattr``/``delattr`` of such a name with a private literal;
- an import of a private torch module or name (``import torch._dynamo``, ``from torch.x import _y``);
- a string in code that names a private torch module or attribute (``"torch._dynamo"``).

``KNOWN`` lists each use that has no public way yet, with its reason; a known use that no longer
occurs fails too, so the table only shrinks.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nbaccel"

# Names that hold torch objects by the package's own convention, wherever they are bound (a hook's
# parameter, say): ``def hook(c10d): c10d._x`` counts as torch's.
CONVENTIONAL = frozenset({"torch", "dist", "c10d", "distributed_c10d", "torch_cuda", "elastic"})

# (module path under nbaccel/, private name): why there is no public way today.
KNOWN: dict[tuple[str, str], str] = {
    ("rank/collective_count.py", "_get_sequence_number_for_group"): (
        "torch keeps each group's count of collectives (its sequence number, which DDP's C++ reducer advances "
        "too) and has no public reader for it in torch 2.13: torch.distributed exposes get_pg_count (groups, not "
        "collectives); torch.distributed.debug.start_debug_server, which collects flight-recorder dumps, is an "
        "experimental HTTP server on every rank that needs aiohttp and Jinja2 and says it is not secure; counting in "
        "Python by wrapping the public collectives would miss those DDP's C++ reducer issues. Read through getattr with "
        "a fallback to no count "
        "(the summary and the pool's in-step check then go without it), never fatal"
    ),
    ("wire/events.py", "torch._dynamo"): (
        "a module name on the warm allow-list: the kernel imports it after a launch only so that later forks "
        "inherit it (DDP imports it in each rank). No public module imports it (torch.compiler, torch.export, "
        "torch.nn.parallel do not); public functions that do (torch.compiler.disable, list_backends) would load it "
        "as a side effect, and whether a rank had to load it can only be asked by its name in sys.modules; a torch "
        "without it just stays cold"
    ),
}

_PRIVATE_IN_TEXT = re.compile(r"\btorch(?:\.\w+)*\.(_[A-Za-z]\w*)")
_ACCESSORS = frozenset({"getattr", "hasattr", "setattr", "delattr"})


@dataclass(frozen=True)
class Use:
    path: str
    line: int
    name: str
    how: str

    def __str__(self) -> str:
        return f"nbaccel/{self.path}:{self.line}: {self.how} {self.name!r}"


def _private(name: str) -> bool:
    """A private name of torch's: ``_x``, not a dunder, nor nbaccel's own mark on its wrappers (``_nbaccel_held``)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and not name.startswith("_nbaccel")


def _is_torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _chain(node: ast.expr) -> list[str]:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return names


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (they may name private things: they only describe)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and _literal(first.value) is not None:
                found.add(id(first.value))
    return found


def _torch_names(tree: ast.AST) -> set[str]:
    """Names bound to torch modules or objects anywhere in the module (coarse: one scope for all)."""
    bound = set(CONVENTIONAL)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_torch_module(alias.name):
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and _is_torch_module(node.module):
            bound.update(alias.asname or alias.name for alias in node.names)
    changed = True
    while changed:  # assignments from torch-bound values, until nothing new
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
                if target not in bound and (_root(value) in bound or _names_torch_module(value)):
                    bound.add(target)
                    changed = True
    return bound


def _names_torch_module(value: ast.expr) -> bool:
    """``sys.modules.get("torch.x")``, ``importlib.import_module("torch.x")`` and the like."""
    if not isinstance(value, ast.Call) or not value.args:
        return False
    text = _literal(value.args[0])
    return text is not None and _is_torch_module(text)


def private_uses(source: str, path: str) -> list[Use]:
    tree = ast.parse(source, path)
    bound, docs, uses = _torch_names(tree), _docstrings(tree), []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and _root(node) in bound:
            uses += [Use(path, line, name, "private attribute") for name in _chain(node)[:1] if _private(name)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ACCESSORS and len(node.args) >= 2:
            name = _literal(node.args[1])
            if name is not None and _private(name) and _root(node.args[0]) in bound:
                uses.append(Use(path, line, name, f"{node.func.id} of a private attribute"))
        elif isinstance(node, ast.Import):
            uses += [
                Use(path, line, a.name, "import of a private module") for a in node.names if _is_torch_module(a.name) and any(map(_private, a.name.split(".")))
            ]
        elif isinstance(node, ast.ImportFrom) and node.module and _is_torch_module(node.module):
            if any(map(_private, node.module.split("."))):
                uses.append(Use(path, line, node.module, "import from a private module"))
            uses += [Use(path, line, a.name, "import of a private name") for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            uses += [Use(path, line, match.group(0), "string naming a private part of torch") for match in _PRIVATE_IN_TEXT.finditer(node.value)]
    return uses


def all_uses() -> list[Use]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += private_uses(path.read_text(), path.relative_to(PACKAGE).as_posix())
    return found


def test_nbaccel_uses_no_private_part_of_torch() -> None:
    uses = all_uses()
    unknown = [str(u) for u in uses if (u.path, u.name) not in KNOWN]
    assert not unknown, "private parts of torch (use its public API; see this file's docstring):\n  " + "\n  ".join(unknown)
    stale = [f"{path}: {name}" for path, name in KNOWN if not any((u.path, u.name) == (path, name) for u in uses)]
    assert not stale, "known private uses that no longer occur (remove them from KNOWN):\n  " + "\n  ".join(stale)


def test_the_check_finds_each_kind_of_private_use() -> None:
    """The check can fail: each form a private use takes is found, and public ones are not."""
    source = '''
import sys
import torch
import torch.distributed as dist
import torch._dynamo
from torch.distributed import distributed_c10d as c10d, _something
from torch._C import _cuda
from torch.distributed.elastic.multiprocessing import start_processes

def f(context, hook):
    """Docstrings may say torch._C."""
    torch._C._cuda_getDeviceCount()
    c10d._update_default_pg = hook
    procs = start_processes(name="x")
    procs._pc.processes
    getattr(dist.group.WORLD, "_get_sequence_number_for_group", None)
    cuda = sys.modules.get("torch.cuda")
    cuda._cached_device_count = None
    warm = ("torch._dynamo",)
    dist.init_process_group("gloo")  # public
    torch.cuda.device_count()  # public
    context._pc  # not torch's
'''
    found = {(u.line, u.name) for u in private_uses(source, "example.py")}
    assert found == {
        (5, "torch._dynamo"),
        (6, "_something"),
        (7, "torch._C"),
        (7, "_cuda"),
        (12, "_C"),
        (12, "_cuda_getDeviceCount"),
        (13, "_update_default_pg"),
        (15, "_pc"),
        (16, "_get_sequence_number_for_group"),
        (18, "_cached_device_count"),
        (19, "torch._dynamo"),
    }, sorted(found)
