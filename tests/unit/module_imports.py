"""The static import graph of modeldsl's own modules, read from the sources with :mod:`ast`.

Every ``.py`` file under the folders that ``pyproject.toml`` maps into the ``modeldsl``
namespace (``[tool.setuptools.package-dir]``: ``modeldsl/``, ``dialects/``, ``passes/``,
``kernels/``, ``tools/``) is a module, named as Python imports it (``passes/fuse.py`` is
``modeldsl.passes.fuse``). Its imports are every ``import`` and ``from ... import`` statement
anywhere in the file, inside functions and methods too (an import deferred to call time is a
dependency all the same), and ``importlib.import_module("modeldsl....")`` with a literal name;
imports under ``if TYPE_CHECKING:`` are left out, as they never run.

An import names the module it loads: ``from modeldsl.lower import lower_program`` is
``modeldsl.lower`` (the package), ``from modeldsl.hf import compat`` is
``modeldsl.hf.compat``. Loading ``modeldsl.a.b`` first runs the package ``modeldsl.a``, so an
import also depends on the packages above its module, except those above the importer
itself (they are loaded already when it runs) and the root ``modeldsl``.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "modeldsl"


@dataclass(frozen=True)
class Import:
    """One import: the module that imports, the module it loads, and where; ``implicit`` for a
    package loaded only because it holds the module named."""

    importer: str
    imported: str
    line: int
    implicit: bool = False


def package_folders() -> dict[str, Path]:
    """Import name of each mapped folder (``modeldsl.passes`` -> ``passes/``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items() if name.split(".")[0] == PACKAGE}


@cache
def module_files() -> dict[str, Path]:
    """Every module of the namespace by its import name (a package by the name of its folder)."""
    folders = package_folders()
    found: dict[str, Path] = {}
    for name, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts or _under_other(path, folder, folders.values()):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


def _under_other(path: Path, folder: Path, folders) -> bool:
    """Whether ``path`` belongs to another mapped folder nested inside ``folder``."""
    return any(o != folder and o.is_relative_to(folder) and path.is_relative_to(o) for o in folders)


def is_package(module: str) -> bool:
    return module_files()[module].name == "__init__.py"


def imports_of(module: str) -> list[Import]:
    """The modeldsl modules ``module`` loads, each import once per line."""
    tree = ast.parse(module_files()[module].read_text(), filename=str(module_files()[module]))
    found: list[Import] = []
    for node, line in _import_nodes(tree):
        for target in _targets(module, node):
            if target != module:
                found.append(Import(module, target, line))
            found += [Import(module, package, line, implicit=True) for package in _packages_above(target, module)]
    return list(dict.fromkeys(found))


@cache
def all_imports() -> tuple[Import, ...]:
    """The imports of every module (read once per test session)."""
    return tuple(i for module in sorted(module_files()) for i in imports_of(module))


def graph() -> dict[str, set[str]]:
    """Each module and the modules it loads."""
    edges: dict[str, set[str]] = {m: set() for m in module_files()}
    for imp in all_imports():
        edges[imp.importer].add(imp.imported)
    return edges


def _import_nodes(tree: ast.AST) -> Iterator[tuple[ast.AST, int]]:
    """Import statements and literal ``importlib.import_module`` calls, outside ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _literal_import_module(node) is not None:
            yield node, node.lineno
        stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _literal_import_module(node: ast.AST) -> str | None:
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    value = node.args[0].value
    return value if name == "import_module" and isinstance(value, str) else None


def _targets(module: str, node: ast.AST) -> list[str]:
    """The modules of the namespace an import node loads (none for a module outside it)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _absolute(module, node.module, node.level)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in module_files() else base
                 for alias in node.names]
    else:
        names = [_literal_import_module(node)]
    return [m for m in (_existing(n) for n in names) if m is not None]


def _absolute(module: str, name: str | None, level: int) -> str:
    """The absolute name of ``from <level dots><name> import ...`` in ``module``."""
    if level == 0:
        return name or ""
    package = module.split(".") if is_package(module) else module.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def _existing(name: str) -> str | None:
    """The longest prefix of a dotted name that is a module of the namespace."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    while parts:
        dotted = ".".join(parts)
        if dotted in module_files():
            return dotted
        parts.pop()
    return None


def _packages_above(target: str, importer: str) -> list[str]:
    """The packages loading ``target`` runs first that are not loaded for ``importer`` already."""
    parts = target.split(".")
    above = [".".join(parts[:i]) for i in range(2, len(parts))]
    mine = importer.split(".")
    loaded = {".".join(mine[:i]) for i in range(1, len(mine) + 1)}
    return [p for p in above if p not in loaded and p in module_files()]


def strongly_connected(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[frozenset[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.add(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        components.append(frozenset(members))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components
