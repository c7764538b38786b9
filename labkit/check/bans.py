"""Switch labkit's own implementation of an exercise off for good, before the student's code runs.

In the notebook, :func:`labkit.check.forbidden` switches it off only while the check runs, so code
the student ran earlier may already hold a reference to it (``_fwd = RowParallelLinear.forward``,
a default argument, a copy made with ``types.FunctionType``). When grading, each check runs in a
fresh process that receives only the source of the answer cells, and :func:`install` runs first:

* a plain function keeps its identity and gets a raising code object, so every reference to it
  (imported names, copies of its ``__code__``) raises :class:`~labkit.check.Forbidden`; nothing
  keeps the original code, so there is nothing to restore or to find;
* a class attribute (a method, an autograd Function's ``forward``) or a function with a closure is
  replaced on its owner, with its underlying function's code swapped too where it has no closure;
* ``importlib.reload`` and a fresh import after ``del sys.modules[...]`` go through a finder put
  first on ``sys.meta_path``, which switches the targets off again as soon as the module has run.

What this cannot stop: code that loads labkit's source file under another name or pastes its
text, or that reaches into the interpreter (``gc``, ``ctypes``, ``sys.meta_path``) to undo this.
Such code is visible in the submission; the grader flags it (``labkit.notebooks.answers``), and
the verdict is computed in the grader's process, which no submission code ever runs in.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

_BANS: dict[str, list[tuple[str, str]]] = {}    # module -> [(attribute path, message)]


def _raiser(*args, **kwargs):  # its code object replaces a banned function's code
    raise __import__("labkit.check", fromlist=["Forbidden"]).Forbidden(
        __import__("sys")._getframe(0).f_code.co_qualname)


def _method(message: str):
    def banned(*args, **kwargs):
        raise __import__("labkit.check", fromlist=["Forbidden"]).Forbidden(message)
    return banned


def _swap_code(fn, message: str) -> bool:
    code = getattr(fn, "__code__", None)
    if code is None or code.co_freevars:
        return False
    fn.__code__ = _raiser.__code__.replace(co_name=message, co_qualname=message)
    return True


def _apply(module) -> None:
    for path, message in _BANS.get(module.__name__, ()):
        owner = module
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name)
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if not isinstance(owner, type) and _swap_code(fn, message):
            continue                                   # a module-level function: its identity is kept
        _swap_code(fn, message)                        # the class's function object raises too
        replacement = _method(message)
        if isinstance(raw, staticmethod):
            replacement = staticmethod(replacement)
        elif isinstance(raw, classmethod):
            replacement = classmethod(replacement)
        setattr(owner, attr, replacement)


class _RebanLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _apply(module)


class _RebanFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: a banned module, imported again or reloaded, is banned again."""

    def find_spec(self, name, path=None, target=None):
        if name not in _BANS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _RebanLoader(spec.loader)
        return spec


def install(targets, why: str = "this exercise asks you to write it yourself") -> None:
    """Ban each ``"module:attribute"`` / ``"module:Class.attribute"`` target for the rest of this
    process. Call it before any of the student's code runs."""
    for target in targets:
        module_name, _, path = target.partition(":")
        message = f"{module_name}.{path} is disabled during this check: {why}"
        _BANS.setdefault(module_name, []).append((path, message))
    if not any(isinstance(f, _RebanFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RebanFinder())
    for module_name in {t.partition(":")[0] for t in targets}:
        module = importlib.import_module(module_name)
        _apply(module)
