"""A notebook cell's source turned into a function that every rank can run (IPython-free).

``compile_cell`` compiles the source as the body of a function ``distributed_cell(state)`` and
wraps it in a `Cell`, which calls it and pickles it (by its source):

- names the cell assigns are the function's locals, so they never leak into the notebook;
- every other name is looked up in ``namespace`` (the notebook's globals), as it is when the
  function runs: at the fork, or when cloudpickle carries the function to a spawned rank;
- ``state`` is predefined as nbaccel's ``PartialState``, set up on first use (`predefined_state`),
  so a cell that never touches it never creates a process group;
- the value of the last expression is returned, as IPython would display it; a trailing ``;``
  suppresses it, and a ``return`` anywhere in the cell works too.

The source is cached in ``linecache`` under the cell's own file name, so tracebacks raised on a
rank show the cell's lines: a forked rank inherits linecache, and an unpickled `Cell` (a spawned
rank, later a remote worker) puts its text back there. A syntax error is raised here, in the
kernel, before anything forks.

``compile_pool_cell`` is the variant for persistent workers: the cell runs as module code with a
rank's namespace as its globals, as a notebook runs a cell, so the names it assigns stay in that
namespace for the next cell. It shares the file name, header, ``;`` and linecache handling.

Example:
    >>> cell = compile_cell("x = 6 * 7\\nx")
    >>> cell()
    42
    >>> compile_cell("x = 6 * 7\\nx;")() is None
    True
    >>> namespace = {}
    >>> compile_pool_cell("x = 6 * 7\\nx")(namespace), namespace["x"]
    (42, 42)
"""

from __future__ import annotations
import __future__

import ast
import builtins
import dis
import functools
import hashlib
import io
import linecache
import tokenize
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11; annotations only, never imported

FUNCTION_NAME = "distributed_cell"
STATE_NAME = "state"

# Only __future__ flags may pass from the notebook's compiler: they change what the source means.
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag

# Names IPython puts into builtins while a cell runs that a rank may use and can carry along.
_NOTEBOOK_BUILTINS = frozenset({"display"})
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME", "STORE_NAME", "DELETE_NAME"})

_NOT_CODE = {tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def predefined_state() -> Any:
    """The ``state`` every cell has predefined: nbaccel's PartialState, set up on first use.

    A `nbaccel.state.lazy.LazyPartialState`: a real ``PartialState`` that joins the process group
    only when the cell first reads one of its attributes. (Imported here, not at the top: it
    brings torch, and loading the magics must stay cheap.)
    """
    from nbaccel.state.lazy import LazyPartialState

    return LazyPartialState()


def compile_cell(
    source: str,
    namespace: dict[str, Any] | None = None,
    *,
    header: str | None = None,
    cache: Callable[[str], str] | None = None,
    flags: int = 0,
) -> Cell:
    """Compile a cell's ``source`` into a `Cell`: a function ``distributed_cell(state=predefined_state())``.

    Args:
        source: the Python code of the cell (IPython syntax already transformed).
        namespace: the globals the cell sees, e.g. the notebook's ``user_ns``; it is used as it
            is, not copied, so what the cell sees is that dict when it runs (a forked rank has
            the dict as it was at the fork).
        header: lines shown above the body in tracebacks, e.g. the ``%%distributed -n 2`` line,
            so that line numbers match the cell as the notebook shows it.
        cache: stores the full text (``header`` + ``source``) in linecache and returns the file
            name to compile under, e.g. ``lambda text: shell.compile.cache(text, number)``.
            Default: a name derived from the text's hash, ``<nbaccel-cell-...>``.
        flags: the notebook compiler's flags; only its ``__future__`` features are applied.

    Returns:
        A `Cell`: calling it runs the cell and returns the value of its last expression (None
        when there is none or it ends with ``;``).

    Raises:
        SyntaxError: the cell is not valid Python, with the cell's file name and line.

    Example:
        >>> cell = compile_cell("y = x + 1\\ny", {"x": 41})
        >>> cell()
        42
    """
    text, filename, offset, future = _prepare(source, header, cache, flags)
    function = _compile_function(source, text, filename, offset, future, {} if namespace is None else namespace)
    return Cell(function, source, header, filename, future)


class Cell(functools.partial):  # type: ignore[type-arg]
    """A compiled cell: call it to run the cell on this process; it pickles by its source.

    Attributes: ``function`` (the plain function), ``source``, ``header``, ``filename``, and
    ``label``: what its ranks are called in ``ps`` (``cell [12]``; None: ``distributed_cell``).

    Pickling ships the source and the notebook globals the cell uses (values pickled as
    cloudpickle does), and recompiles on the other side under the same file name, with the
    text back in linecache. (cloudpickle renames every function's file to ``<dynamic-code>``,
    which would leave a spawned rank's traceback without the cell's lines.)

    Example:
        >>> import pickle
        >>> cell = compile_cell("n * 2", {"n": 21, "unused": object()})
        >>> pickle.loads(pickle.dumps(cell))()
        42
    """

    source: str
    header: str | None
    filename: str
    flags: int
    label: str | None
    __name__: str
    __qualname__: str

    # A partial, not a class with a Python __call__: calling it adds no frame of nbaccel's
    # between the worker and the cell, so a rank's traceback starts at the cell's own line.
    def __new__(cls, function: types.FunctionType, source: str, header: str | None, filename: str, flags: int) -> Self:
        self = super().__new__(cls, function)
        self.source = source
        self.header = header
        self.filename = filename
        self.flags = flags
        self.label = None
        self.__name__ = self.__qualname__ = FUNCTION_NAME
        return self

    @property
    def function(self) -> types.FunctionType:
        return cast(types.FunctionType, self.func)

    def __repr__(self) -> str:
        return f"<nbaccel cell {self.filename}>"

    def globals_used(self) -> dict[str, Any]:
        """The globals the cell's code (nested functions and classes included) refers to."""
        namespace = self.function.__globals__  # type: ignore[attr-defined]  # mypy reads this FunctionType property as MethodType
        names = _global_names(self.function.__code__)
        used = {name: namespace[name] for name in names if name in namespace}
        for name in names & _NOTEBOOK_BUILTINS:
            if name not in used and hasattr(builtins, name):
                used[name] = getattr(builtins, name)  # IPython's, importable wherever IPython is
        if "__name__" in namespace:
            used["__name__"] = namespace["__name__"]
        return used

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.source, self.header, self.filename, self.flags, self.globals_used(), self.label))


def _rebuild(source: str, header: str | None, filename: str, flags: int, namespace: dict[str, Any], label: str | None = None) -> Cell:
    cell = compile_cell(source, namespace, header=header, cache=lambda text: _cache_as(filename, text), flags=flags)
    cell.label = label
    return cell


def compile_pool_cell(source: str, *, header: str | None = None, cache: Callable[[str], str] | None = None, flags: int = 0) -> PoolCell:
    """Compile a cell's ``source`` to run with a persistent namespace as its globals (a `PoolCell`).

    Unlike `compile_cell`, the cell is not a function body: it runs as module code, as a notebook
    runs a cell, so the names it assigns persist in the namespace it runs in. ``header``,
    ``cache`` and ``flags`` are as for `compile_cell`, and so are ``;`` and syntax errors.

    Example:
        >>> rank_namespace = {"scale": 10}
        >>> cell = compile_pool_cell("w = scale * 2\\nw + 1")
        >>> cell(rank_namespace), rank_namespace["w"]
        (21, 20)
        >>> compile_pool_cell("w;")(rank_namespace) is None
        True
    """
    text, filename, offset, future = _prepare(source, header, cache, flags)
    body, last = _compile_module(source, text, filename, offset, future)
    return PoolCell(body, last, source, header, filename, future)


class PoolCell:
    """A cell compiled for persistent workers: ``cell(namespace)`` runs it there, returns its value.

    Attributes: ``source``, ``header``, ``filename``, ``flags``. Like `Cell`, it pickles by its
    source and recompiles under the same file name, with the text back in linecache (the rank
    forked before this cell existed, and cloudpickle would rename the code to ``<dynamic-code>``).

    Example:
        >>> import pickle
        >>> cell = pickle.loads(pickle.dumps(compile_pool_cell("n = 2\\nn * 21")))
        >>> cell({}), cell.filename.startswith("<nbaccel-cell-")
        (42, True)
    """

    __slots__ = ("_body", "_last", "filename", "flags", "header", "source")

    def __init__(self, body: types.CodeType, last: types.CodeType | None, source: str, header: str | None, filename: str, flags: int) -> None:
        self._body, self._last = body, last
        self.source, self.header, self.filename, self.flags = source, header, filename, flags

    def __call__(self, namespace: dict[str, Any]) -> Any:
        exec(self._body, namespace)  # the user's own cell, in the user's own worker
        return None if self._last is None else eval(self._last, namespace)

    def __repr__(self) -> str:
        return f"<nbaccel pool cell {self.filename}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_pool_cell, (self.source, self.header, self.filename, self.flags))


def _rebuild_pool_cell(source: str, header: str | None, filename: str, flags: int) -> PoolCell:
    return compile_pool_cell(source, header=header, cache=lambda text: _cache_as(filename, text), flags=flags)


def _prepare(source: str, header: str | None, cache: Callable[[str], str] | None, flags: int) -> tuple[str, str, int, int]:
    """The cached text (header + source), its file name, the header's line count, the future flags."""
    text = source if header is None else f"{header}\n{source}"
    filename = (cache or _cache_in_linecache)(text)
    offset = 0 if header is None else header.count("\n") + 1
    return text, filename, offset, flags & _FUTURE_FLAGS


def _parse(source: str, filename: str, offset: int, future: int) -> ast.Module:
    # Blank lines in place of the header keep the parser's line numbers equal to the cached text's.
    tree = compile("\n" * offset + source, filename, "exec", ast.PyCF_ONLY_AST | future, dont_inherit=True)
    assert isinstance(tree, ast.Module)
    return tree


def _shows_last(body: list[ast.stmt], source: str) -> bool:
    """Whether the cell ends with an expression whose value is shown (no trailing ``;``)."""
    return bool(body) and isinstance(body[-1], ast.Expr) and not _ends_with_semicolon(source)


def _compile_module(source: str, text: str, filename: str, offset: int, future: int) -> tuple[types.CodeType, types.CodeType | None]:
    """The cell as module code, and its last expression compiled apart (None when not shown)."""
    body = _parse(source, filename, offset, future).body
    last = body.pop() if _shows_last(body, source) else None
    try:
        code = compile(ast.Module(body=body, type_ignores=[]), filename, "exec", future, dont_inherit=True)
        value = None if last is None else compile(ast.Expression(body=last.value), filename, "eval", future, dont_inherit=True)  # type: ignore[attr-defined]
    except SyntaxError as error:  # what the parser accepts but the compiler does not (return, await)
        raise _explained(error, text) from None
    return code, value


def _compile_function(source: str, text: str, filename: str, offset: int, future: int, namespace: dict[str, Any]) -> types.FunctionType:
    tree = _parse(source, filename, offset, future)
    _reject_yield(tree.body, filename, text)
    module = ast.Module(body=[_as_function(tree.body, returns_last=_shows_last(tree.body, source))], type_ignores=[])
    ast.fix_missing_locations(module)
    try:
        code = compile(module, filename, "exec", future, dont_inherit=True)
    except SyntaxError as error:  # what is legal in a module but not in a function body
        raise _explained(error, text) from None
    function_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    function = types.FunctionType(function_code, namespace, FUNCTION_NAME)
    function.__defaults__ = (predefined_state(),)
    return function


def _as_function(body: list[ast.stmt], returns_last: bool) -> ast.FunctionDef:
    """``def distributed_cell(state=None): <body>`` with the last expression returned."""
    if returns_last:
        last = body[-1]
        assert isinstance(last, ast.Expr)  # what returns_last means (_shows_last)
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
        error.msg += " (a %%distributed cell cannot await at its top level: call asyncio.run(...) in it)"
    elif error.msg.startswith("'return' outside function"):
        error.msg += " (with running workers a %%distributed cell runs as notebook code: end it with the expression to show)"
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
            raise SyntaxError(  # Python's own error for a top-level yield
                "'yield' outside function (a %%distributed cell runs as a function body, but not as a generator)",
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
        if not isinstance(node, scopes):
            stack.extend(ast.iter_child_nodes(node))
    return found


def _global_names(code: types.CodeType) -> set[str]:
    """Names looked up in globals by ``code`` and every code object nested in it."""
    names: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        names.update(i.argval for i in dis.get_instructions(current) if i.opname in _GLOBAL_OPS)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return names


def _cache_in_linecache(text: str) -> str:
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return _cache_as(f"<nbaccel-cell-{digest}>", text)


def _cache_as(filename: str, text: str) -> str:
    # mtime None: linecache.checkcache never drops it (IPython caches its cells the same way).
    linecache.cache[filename] = (len(text), None, [line + "\n" for line in text.splitlines()], filename)
    return filename
