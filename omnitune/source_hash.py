"""The kernel source hash that provenance records: what a tuned config was measured on.

A config is only as good as the device code it was measured with, so tables record a hash of that
code. Only the code that runs on the GPU counts: the `@triton.jit` functions a kernel module
defines, the jit functions they call (by name, transitively, wherever those are defined, except
Triton's own library such as tl.sum, which the Triton version stands for) and the plain constants
(ints, floats, strings, `tl.constexpr`s) their bodies read from module globals.
Comments, blank lines, trailing spaces and the jit functions' docstrings are dropped first. So an
edit to the module's docstring, its launcher, its reference or its baselines leaves the hash
unchanged, and an edit to a kernel changes it.

The hash reads the Python source of each jit function (`.fn`), not Triton's `.src`: under
TRITON_INTERPRET=1 `@triton.jit` gives an InterpretedFunction, which has no `.src`, and the hash
must be the same on a CPU machine (CI, `omnitune verify --interpret`) as on the GPU that tuned.

A module with no jit functions (a kernel written without Triton) is hashed whole. So were all
modules before this hash existed: `module_source_hash` is that older hash, which
omnitune.provenance.provenance_hash translates and `omnitune verify` still accepts for tables
exported before.

A kernel may run code of other modules that its own must not import (KernelSpec's
`extra_source_modules`: attention's Gluon kernel, whose module imports Gluon and is imported only
at its first launch; KernelSpec.source_matches accepts the hash without them for configs that do
not run them). Those are read as text from their files, never imported, and their code, without
comments, docstrings and blank lines, joins the hash: the whole of it, launcher included, since
a module that is not Triton's has no jit functions to pick out (a Gluon kernel's launcher builds
the descriptors and layouts its configs were measured with).

Standard library only at import time (omnitune.spec, and so the runtime, imports it).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import io
import textwrap
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HEX_DIGITS = 16
UNKNOWN = "unknown"


def kernel_source_hash(module: Any, extra_modules: Sequence[str] = ()) -> str:
    """The hash of a kernel module's device code (see the module doc); the whole module's when it
    defines no jit functions; with the code of `extra_modules` (dotted names, read from their
    files, not imported) joined in; "unknown" when a source cannot be read."""
    own = _own_source_hash(module)
    if not extra_modules or own == UNKNOWN:
        return own  # the hash of a kernel without extra modules, as tables have always recorded it
    try:
        extras = [normalized_module_source(module_file(name).read_text(encoding="utf-8")) for name in extra_modules]
    except (OSError, ImportError, ValueError, SyntaxError):  # UnicodeDecodeError is a ValueError
        return UNKNOWN
    return _digest("\n\f\n".join([own, *extras]))


def _own_source_hash(module: Any) -> str:
    try:
        functions = jit_functions(module)
        if not functions:
            return module_source_hash(module)
        parts = sorted(_describe(obj) for obj in functions.values())
    except (OSError, TypeError, SyntaxError):
        return UNKNOWN
    return _digest("\n\f\n".join(parts))


def module_file(name: str) -> Path:
    """The source file of the module named `name`, found without importing it (its parent
    packages are imported); ImportError when there is none."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ImportError(f"no Python source file for module {name}")
    return Path(spec.origin)


def module_source_hash(module: Any) -> str:
    """sha256 (first 16 hex digits) of the whole module's source: the hash tables recorded before
    only the jit sources were hashed."""
    try:
        return _digest(inspect.getsource(module))
    except (OSError, TypeError):
        return UNKNOWN


def jit_functions(module: Any) -> dict[str, Any]:
    """The jit functions the module defines and every jit function they call, transitively,
    keyed by "<module>.<qualname>"."""
    name = getattr(module, "__name__", None)
    pending = [obj for obj in map(_unwrap, vars(module).values())
               if obj is not None and getattr(obj.fn, "__module__", None) == name]
    found: dict[str, Any] = {}
    while pending:
        obj = pending.pop()
        key = f"{obj.fn.__module__}.{obj.fn.__qualname__}"
        if key in found:
            continue
        found[key] = obj
        pending.extend(callee for callee in _referenced(obj)[0] if not _in_triton(callee))
    return found


def _in_triton(obj: Any) -> bool:
    # tl.sum, tl.max, … are jit functions of Triton's own library: they change with Triton, whose
    # version the tables record apart (a soft difference), so they are not the kernel's source.
    module = getattr(obj.fn, "__module__", "") or ""
    return module == "triton" or module.startswith("triton.")


def _jit_classes() -> tuple[type, ...]:
    classes: list[type] = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except ImportError:  # no Triton: nothing can be a jit function
        return ()
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    return tuple(classes)


def _unwrap(obj: Any) -> Any:
    """The jit function `obj` is or wraps (@triton.autotune and @triton.heuristics hold theirs in
    `.fn`), or None."""
    classes = _jit_classes()
    if not classes:
        return None
    for _ in range(8):  # a wrapper of a wrapper …, never a cycle in practice
        if isinstance(obj, classes):
            return obj
        if type(obj).__name__ not in ("Autotuner", "Heuristics"):
            return None
        obj = getattr(obj, "fn", None)
    return None


def _source(obj: Any) -> str:
    return textwrap.dedent(inspect.getsource(obj.fn))


def _referenced(obj: Any) -> tuple[list[Any], list[str]]:
    """The jit functions a jit function's body names, and `name=value` for each plain constant
    it reads from its module's globals."""
    tree = ast.parse(_source(obj))
    scope = getattr(obj.fn, "__globals__", {})
    callees: list[Any] = []
    constants: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in scope:
            value = scope[node.id]
            callee = _unwrap(value)
            if callee is not None:
                callees.append(callee)
            elif _is_constant(value):
                constants.add(f"{node.id}={_constant_repr(value)}")
        elif isinstance(node, ast.Attribute):
            # module.helper(...): a jit function reached through another module
            chain = _attribute_chain(node)
            if chain and chain[0] in scope:
                value = scope[chain[0]]
                for attr in chain[1:]:
                    value = getattr(value, attr, None)
                callee = _unwrap(value)
                if callee is not None:
                    callees.append(callee)
    return callees, sorted(constants)


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    names: list[str] = []
    current: ast.AST = node
    while isinstance(current, ast.Attribute):
        names.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    names.append(current.id)
    return names[::-1]


def _is_constant(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return True
    return type(value).__name__ == "constexpr" and _is_constant(getattr(value, "value", object()))


def _constant_repr(value: Any) -> str:
    return repr(getattr(value, "value", value)) if type(value).__name__ == "constexpr" else repr(value)


def _describe(obj: Any) -> str:
    """What is hashed for one jit function: its qualified name, its normalized source and the
    constants it reads. The module's name is left out: a user's kernel file is imported under
    different module names on different machines."""
    _, constants = _referenced(obj)
    return "\n".join([obj.fn.__qualname__, normalized_source(_source(obj)), *constants])


def normalized_source(source: str) -> str:
    """`source` (one function) without comments, its docstring, trailing spaces and blank lines."""
    body = ast.parse(source).body
    function = body[0] if body else None
    docstring: list[ast.stmt] = []
    if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(function) is not None:
        docstring.append(function.body[0])
    return _without(source, docstring)


def normalized_module_source(source: str) -> str:
    """A whole module's `source` without comments, trailing spaces, blank lines and its string
    statements: docstrings (the module's, its classes' and functions') and the attribute docs
    written under an assignment, which do nothing when run."""
    strings = [node for node in ast.walk(ast.parse(source)) if _is_string_statement(node)]
    return _without(source, strings)


def _is_string_statement(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _without(source: str, statements: Sequence[ast.stmt]) -> str:
    """`source` without the lines of `statements`, its comments, trailing spaces and blank lines."""
    lines = source.splitlines()
    drop: set[int] = set()
    for statement in statements:
        drop.update(range(statement.lineno - 1, (statement.end_lineno or statement.lineno)))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    kept = [line.rstrip() for i, line in enumerate(lines) if i not in drop]
    return "\n".join(line for line in kept if line.strip())


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:HEX_DIGITS]
