"""A notebook cell's source turned into a function that every rank can run (IPython-free).

``compile_cell`` compiles the source as the body of a function ``distributed_cell(state)``:

- names the cell assigns are the function's locals, so they never leak into the notebook;
- every other name is looked up in ``namespace`` (the notebook's globals), as it is when the
  function runs: at the fork, or when cloudpickle carries the function to a spawned rank;
- ``state`` is predefined as a lazy stand-in for ``nbaccel.PartialState()``, created on first use,
  so a cell that never touches it never creates a process group;
- the value of the last expression is returned, as IPython would display it; a trailing ``;``
  suppresses it, and a ``return`` anywhere in the cell works too.

The source is cached in ``linecache`` under the cell's own file name, so tracebacks raised on a
rank show the cell's lines (a forked rank inherits linecache; the spawn starter ships the entry).
A syntax error is raised here, in the kernel, before anything forks.

Example:
    >>> fn = compile_cell("x = 6 * 7\\nx")
    >>> fn()
    42
    >>> compile_cell("x = 6 * 7\\nx;")() is None
    True
"""

from __future__ import annotations

import __future__
import ast
import hashlib
import io
import linecache
import tokenize
import types
from collections.abc import Callable
from typing import Any

FUNCTION_NAME = "distributed_cell"
STATE_NAME = "state"

# Only __future__ flags may pass from the notebook's compiler: they change how the source means.
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag

_NOT_CODE = {tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


class LazyState:
    """``state`` in a cell: ``nbaccel.PartialState()``, made on first attribute access.

    Nothing is created until the cell uses it, so a cell that never touches ``state`` pays for
    no process group. Every access asks ``PartialState()`` again (a cheap view of the shared
    state), so nothing stale survives a fork or a reset. It pickles to a fresh stand-in.

    Example:
        >>> state = LazyState()
        >>> state  # doctest: +SKIP
        <state: nbaccel.PartialState, created on first use>
        >>> state.num_processes  # doctest: +SKIP
        2
    """

    __slots__ = ()

    @staticmethod
    def resolve() -> Any:
        """The ``nbaccel.PartialState()`` this stands for (created now if needed)."""
        import nbaccel

        return nbaccel.PartialState()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # copy/pickle probe dunders: never build a process group for them
        return getattr(self.resolve(), name)

    def __dir__(self) -> list[str]:
        import nbaccel

        return sorted(set(dir(nbaccel.PartialState)) | {"resolve"})

    def __repr__(self) -> str:
        import sys

        module = sys.modules.get("nbaccel.state")
        created = module is not None and getattr(module.PartialState, "_shared", None) is not None
        return repr(self.resolve()) if created else "<state: nbaccel.PartialState, created on first use>"

    def __reduce__(self) -> tuple[type[LazyState], tuple[()]]:
        return (LazyState, ())


def compile_cell(
    source: str,
    namespace: dict[str, Any] | None = None,
    *,
    header: str | None = None,
    cache: Callable[[str], str] | None = None,
    flags: int = 0,
) -> types.FunctionType:
    """Compile a cell's ``source`` into a function ``distributed_cell(state=<lazy>)``.

    Args:
        source: the Python code of the cell (IPython syntax already transformed).
        namespace: the globals the function sees, e.g. the notebook's ``user_ns``; it is used
            as it is, not copied, so what the function sees is that dict at call time.
        header: lines shown above the body in tracebacks, e.g. the ``%%distributed -n 2`` line,
            so that line numbers match the cell as the notebook shows it.
        cache: stores the full text (``header`` + ``source``) in linecache and returns the file
            name to compile under, e.g. ``lambda text: shell.compile.cache(text, number)``.
            Default: a name derived from the text's hash, ``<nbaccel-cell-...>``.
        flags: the notebook compiler's flags; only its ``__future__`` features are applied.

    Returns:
        A plain function (cloudpickle can carry it) that takes no required argument and returns
        the value of the cell's last expression (None when there is none or it ends with ``;``).

    Raises:
        SyntaxError: the cell is not valid Python, with the cell's file name and line.

    Example:
        >>> fn = compile_cell("y = x + 1\\ny", {"x": 41})
        >>> fn()
        42
    """
    offset = 0 if header is None else header.count("\n") + 1
    text = source if header is None else f"{header}\n{source}"
    filename = (cache or _cache_in_linecache)(text)
    future = flags & _FUTURE_FLAGS
    # Blank lines in place of the header keep the parser's line numbers equal to the cached text's.
    tree = compile("\n" * offset + source, filename, "exec", ast.PyCF_ONLY_AST | future, dont_inherit=True)
    assert isinstance(tree, ast.Module)
    _reject_yield(tree.body, filename, text)
    module = ast.Module(body=[_as_function(tree.body, returns_last=not _ends_with_semicolon(source))], type_ignores=[])
    ast.fix_missing_locations(module)
    try:
        code = compile(module, filename, "exec", future, dont_inherit=True)
    except SyntaxError as error:  # what is legal in a module but not in a function body
        raise _explained(error, text) from None
    function_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    function = types.FunctionType(function_code, namespace if namespace is not None else {}, FUNCTION_NAME)
    function.__defaults__ = (LazyState(),)
    function.__doc__ = "A %%distributed cell; returns the value of its last expression."
    return function


def _as_function(body: list[ast.stmt], returns_last: bool) -> ast.FunctionDef:
    """``def distributed_cell(state=None): <body>`` with the last expression returned."""
    if returns_last and body and isinstance(body[-1], ast.Expr):
        last = body[-1]
        body = [*body[:-1], ast.copy_location(ast.Return(value=last.value), last)]
    # Parsing a template keeps this independent of the FunctionDef fields of each Python version.
    function = ast.parse(f"def {FUNCTION_NAME}({STATE_NAME}=None):\n    pass").body[0]
    assert isinstance(function, ast.FunctionDef)
    # The def keeps the template's line 1 (the header's line, when there is one).
    function.body = body or [ast.Pass()]
    return function


def _explained(error: SyntaxError, text: str) -> SyntaxError:
    lines = text.splitlines()
    if error.text is None and error.lineno is not None and 0 < error.lineno <= len(lines):
        error.text = lines[error.lineno - 1]  # compiling an AST leaves the offending line out
    if error.msg.startswith("import *"):
        error.msg += " (a %%distributed cell runs as a function body: import the names you use, or the module)"
    elif "await" in error.msg:
        error.msg += " (a %%distributed cell runs as a plain function body: call asyncio.run(...) in it)"
    return error


def _ends_with_semicolon(source: str) -> bool:
    """Whether the last token of code (comments aside) is ``;``, IPython's "don't display" mark."""
    last = None
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in _NOT_CODE:
                last = token
    except (tokenize.TokenError, SyntaxError):  # the parser already accepted it; be lenient
        return source.rstrip().endswith(";")
    return last is not None and last.type == tokenize.OP and last.string == ";"


def _reject_yield(body: list[ast.stmt], filename: str, text: str) -> None:
    """A cell is not a generator: ``yield`` at its top level is a SyntaxError, as in a notebook."""
    for node in _top_level_nodes(body):
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            lines = text.splitlines()
            line = lines[node.lineno - 1] if node.lineno <= len(lines) else None
            raise SyntaxError(
                "'yield' outside function (a %%distributed cell runs as a function body, "
                "but not as a generator)",
                (filename, node.lineno, node.col_offset + 1, line),
            )


def _top_level_nodes(body: list[ast.stmt]) -> list[ast.AST]:
    """Nodes of the cell itself, not inside functions, lambdas or classes it defines."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = list(body)
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, scopes))
    return found


def _cache_in_linecache(text: str) -> str:
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    filename = f"<nbaccel-cell-{digest}>"
    # mtime None: linecache.checkcache never drops it (IPython caches its cells the same way).
    linecache.cache[filename] = (len(text), None, [line + "\n" for line in text.splitlines()], filename)
    return filename
