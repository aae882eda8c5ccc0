"""Imports of Module DSL programs: search order, versions, name conflicts, the lock manifest.

``import a.b.c [as X]``, ``import a.b.{X, Y}`` and ``from a.b import X as Y``
are searched in the order of spec 4.7.1: the bundled standard library
(``modeldsl/std``), then relative to the importing file, then relative to the
working directory. A path names a file (``std.modules.linear`` is
``std/modules/linear.module``, all of its declarations are imported), or a
declaration in a file (``std.modules.linear.Linear``), or a folder of files
(``import std.primitives`` imports the declarations of each of its files, the
newest version of each); a last component ``vN`` asks for exactly that version
(``matmul.v1`` is ``matmul.v1.module``), no version takes the newest. A path
without the ``std.`` prefix (``import primitives``, ``import modules.linear``) is
also looked for in the standard library, after the project's folders. Where no
``.module`` file is found, a ``NAME.py`` file of the Python DSL is read
(:mod:`modeldsl.frontend.python`): ``std.python.modules.norm`` is
``std/python/modules/norm.py``; its stacks of an imported block named by a string
(``Array["n", "Blk"]``) get the block's parameters bound by name here, once the file's names are
known (:func:`modeldsl.frontend.python.translate.bind_by_name`).

Two imports of one name are E023, an alias that shadows a name already
imported is E024, a local declaration that shadows an import is W002 and one
that shadows a primitive is W001. Every ``primitive`` declaration of a
resolved file is checked against the op registry
(:mod:`modeldsl.resolve.primitive_decls`), and the section words of every declaration
(:mod:`modeldsl.resolve.sections`: an unknown one is E001 with the closest known word).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from modeldsl.diagnostics import DiagnosticError, DiagnosticSink, Span
from modeldsl.frontend.text import ast
from modeldsl.frontend.text.parser import parse_source, read_source
from modeldsl.primitives import lookup_primitive
from modeldsl.resolve.invariants import check_declared_invariants
from modeldsl.resolve.primitive_decls import check_primitive_decls
from modeldsl.resolve.sections import check_sections
from modeldsl.resolve.user_annotations import check_builtin_declarations

STD_ROOT = Path(__file__).resolve().parents[1] / "std"
VERSION = re.compile(r"^v(\d+)$")


@dataclass
class Imported:
    decl: ast.Decl
    origin: str  # dotted module path it came from
    span: Span


@dataclass
class ResolvedProgram:
    """A program with every visible declaration by name, and the files it loaded."""

    program: ast.Program
    decls: dict[str, ast.Decl]
    loaded: dict[str, Path] = field(default_factory=dict)  # dotted path -> file
    namespaces: dict[int, dict[str, ast.Decl]] = field(default_factory=dict)  # id(decl) -> its file's names

    def namespace_of(self, decl: ast.Decl) -> dict[str, ast.Decl]:
        """The names visible inside a declaration: those of the file that declares it."""
        return self.namespaces.get(id(decl), self.decls)

    def lock_manifest(self) -> str:
        """The ``module.lock`` text of spec 4.7.1: every resolved module and its content hash."""
        lines = ["version: 1", "resolved_modules:"]
        for dotted, path in sorted(self.loaded.items()):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
            where = "std" if _is_within(path, STD_ROOT) else "local"
            version = _version_of(path) or "latest"
            lines.append(f"  {dotted}: {version} {where}@{digest}")
        return "\n".join(lines) + "\n"


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False


def _version_of(path: Path) -> str | None:
    parts = path.name.split(".")
    return parts[-2] if len(parts) >= 3 and VERSION.match(parts[-2]) else None


class Resolver:
    def __init__(self, sink: DiagnosticSink, search: list[Path] | None = None):
        self.sink = sink
        self.search = search
        self.cache: dict[Path, ast.Program] = {}
        self.loaded: dict[str, Path] = {}
        self.namespaces: dict[int, dict[str, ast.Decl]] = {}
        self.resolving: set[int] = set()

    def resolve(self, program: ast.Program) -> ResolvedProgram:
        decls = self.namespace(program)
        return ResolvedProgram(program, decls, dict(self.loaded), dict(self.namespaces))

    def namespace(self, program: ast.Program) -> dict[str, ast.Decl]:
        """The names visible in a file (its imports and its declarations), each
        imported file resolved in turn so its declarations see their own imports."""
        key = id(program)
        if program.declarations and id(program.declarations[0]) in self.namespaces:
            return self.namespaces[id(program.declarations[0])]
        if key in self.resolving:
            return {d.name: d for d in program.declarations}
        self.resolving.add(key)
        visible: dict[str, Imported] = {}
        base = Path(program.source.name).resolve().parent
        for item in program.imports:
            for name, imported in self.import_names(item, base):
                self.bind(visible, name, imported, item)
        decls = {namespace_key(imported.decl, name): imported.decl for name, imported in visible.items()}
        decls.update(self.qualified_names(program, base))
        for decl in program.declarations:
            if decl.kind == "annotation":
                decls[namespace_key(decl)] = decl
                continue
            if decl.name in visible:
                self.sink.warning("W002", f"{decl.kind} {decl.name} shadows the imported {decl.name} "
                                  f"from {visible[decl.name].origin}", decl.span.word(decl.name), "rename one of them")
            if lookup_primitive(decl.name) is not None and decl.kind != "primitive":
                self.sink.warning("W001", f"{decl.kind} {decl.name} shadows the primitive {decl.name}",
                                  decl.span.word(decl.name),
                                  "rename it unless you mean to replace the primitive")
            decls[decl.name] = decl
        if program.by_name:  # a Python DSL file's stacks of an imported block named by a string
            from modeldsl.frontend.python.translate import bind_by_name

            bind_by_name(program.by_name, decls)
            program.by_name = []
        check_sections(program.declarations, self.sink)
        check_primitive_decls(program.declarations, self.sink)
        check_declared_invariants(program.declarations, self.sink)
        check_builtin_declarations(program.declarations, self.sink)
        for decl in program.declarations:
            self.namespaces[id(decl)] = decls
        self.resolving.discard(key)
        return decls

    def qualified_names(self, program: ast.Program, base: Path) -> dict[str, ast.Decl]:
        """``models.llama.Attention(...)`` in a declaration (spec 4.7.1's qualified names):
        each dotted callee that names a declaration of a findable file, by its dotted name."""
        found: dict[str, ast.Decl] = {}
        for call, path in _qualified_calls(program):
            dotted = ".".join(path)
            if dotted in found or self.find_file(path[:-1], base) is None:
                continue  # not a module path: the lowering reports the callee
            loaded, _ = self.load(path[:-1], base, call.span, quiet=True)
            decl = next((d for d in loaded.declarations if d.name == path[-1]), None) if loaded else None
            if decl is not None:
                found[dotted] = decl
        return found

    def bind(self, visible: dict[str, Imported], name: str, imported: Imported, item: ast.Node) -> None:
        previous = visible.get(name)
        if previous is None or previous.decl is imported.decl:
            visible[name] = imported
            return
        aliased = isinstance(item, ast.Import) and item.alias == name or (
            isinstance(item, ast.FromImport) and any(alias == name for _, alias in item.items)
        )
        if aliased:
            self.sink.error("E024", f"the alias '{name}' shadows '{name}' imported from {previous.origin}",
                            item.span.word(name, last=True), "choose another alias")
        else:
            self.sink.error("E023", f"'{name}' is imported from both {previous.origin} and {imported.origin}",
                            item.span.word(name, last=True),
                            f"import one of them with an alias: import ... as Other{name}")

    # ------------------------------------------------------------------ finding modules
    def import_names(self, item: ast.Node, base: Path) -> list[tuple[str, Imported]]:
        if isinstance(item, ast.FromImport):
            program, dotted = self.load_file_or_package(item.path, base, item.span)
            if program is None:
                return []
            found = [(alias or name, self.find_decl(program, dotted, name, item.span)) for name, alias in item.items]
            return [(n, d) for n, d in found if d is not None]
        assert isinstance(item, ast.Import)
        if item.names is not None:
            program, dotted = self.load_file_or_package(item.path, base, item.span)
            if program is None:
                return []
            found = [(n, self.find_decl(program, dotted, n, item.span)) for n in item.names]
            return [(n, d) for n, d in found if d is not None]
        versioned = bool(VERSION.match(item.path[-1]))
        program, dotted = self.load(item.path, base, item.span, quiet=not versioned)
        if program is None and versioned:
            return []
        if program is None:
            package = self.load_package(item.path, base)
            if package is not None:
                if item.alias is not None:
                    self.sink.error("E002", f"'import {'.'.join(item.path)} as {item.alias}' names a folder of "
                                    "modules, which cannot take an alias", item.span,
                                    "import a file or a declaration by name: import a.b.Name as Alias")
                    return []
                return [(d.name, Imported(d, origin, item.span)) for origin, d in package]
        if program is not None:
            decls = program.declarations
            if item.alias is not None:
                if len(decls) != 1:
                    self.sink.error("E002", f"'import {'.'.join(item.path)} as {item.alias}' needs a file with one "
                                    f"declaration; it has {len(decls)}", item.span,
                                    "import the declaration by name: import a.b.Name as Alias")
                    return []
                return [(item.alias, Imported(decls[0], dotted, item.span))]
            return [(d.name, Imported(d, dotted, item.span)) for d in decls]
        if len(item.path) == 1:
            self.sink.error("E002", f"cannot find module '{item.path[0]}'", item.span,
                            "searched the standard library, the importing file's folder and the working folder")
            return []
        program, dotted = self.load_file_or_package(item.path[:-1], base, item.span)
        if program is None:
            return []
        imported = self.find_decl(program, dotted, item.path[-1], item.span)
        return [(item.alias or item.path[-1], imported)] if imported is not None else []

    def find_decl(self, program: ast.Program | list[tuple[str, ast.Decl]], dotted: str, name: str,
                  span: Span) -> Imported | None:
        """The declaration ``name`` of a file, or of a package's files (given as (origin, decl) pairs)."""
        pairs = program if isinstance(program, list) else [(dotted, d) for d in program.declarations]
        for origin, decl in pairs:
            if decl.name == name:
                return Imported(decl, origin, span)
        self.sink.error("E002", f"{dotted} has no declaration '{name}'", span.word(name, last=True),
                        f"it declares: {', '.join(d.name for _, d in pairs) or 'nothing'}")
        return None

    def load_file_or_package(self, path: list[str], base: Path,
                             span: Span) -> tuple[ast.Program | list[tuple[str, ast.Decl]] | None, str]:
        """A file, else a folder of files (for ``import a.b.{X, Y}`` and ``from a.b import X``)."""
        dotted = ".".join(path)
        if self.find_file(path, base) is None and not VERSION.match(path[-1]):
            package = self.load_package(path, base)
            if package is not None:
                return package, dotted
        return self.load(path, base, span)

    def load_package(self, path: list[str], base: Path) -> list[tuple[str, ast.Decl]] | None:
        """The declarations of every file of a folder (the newest version of each), with the
        dotted path of the file they come from; None when no folder holds modules."""
        folder = self.find_package(path, base)
        if folder is None:
            return None
        stems = sorted({_stem(p) for p in folder.glob("*.module")})
        found: list[tuple[str, ast.Decl]] = []
        for stem in stems:
            program, dotted = self.load_file(_newest(folder, stem), ".".join([*path, stem]))
            if program is not None:
                found.extend((dotted, decl) for decl in program.declarations)
        return found

    def find_package(self, path: list[str], base: Path) -> Path | None:
        if not path:
            return None
        for root, parts in self.search or _roots(path, base):
            folder = root.joinpath(*parts)
            if folder.is_dir() and any(folder.glob("*.module")):
                return folder
        return None

    def load(self, path: list[str], base: Path, span: Span, quiet: bool = False) -> tuple[ast.Program | None, str]:
        dotted = ".".join(path)
        file = self.find_file(path, base)
        if file is None:
            if not quiet:
                self.sink.error("E002", f"cannot find module '{dotted}'", span,
                                "searched the standard library, the importing file's folder and the working folder")
            return None, dotted
        return self.load_file(file, dotted)

    def load_file(self, file: Path, dotted: str) -> tuple[ast.Program | None, str]:
        self.loaded[dotted] = file
        if file not in self.cache:
            try:
                self.cache[file] = _parse_file(file)
            except DiagnosticError as err:
                for diagnostic in err.diagnostics:
                    self.sink.add(diagnostic)
                return None, dotted
            self.namespace(self.cache[file])
        return self.cache[file], dotted

    def find_file(self, path: list[str], base: Path) -> Path | None:
        if not path:
            return None
        version = path[-1] if VERSION.match(path[-1]) else None
        stem = path[:-1] if version else path
        roots = self.search or _roots(stem, base)
        for root, parts in roots:
            folder = root.joinpath(*parts[:-1]) if parts[:-1] else root
            name = parts[-1] if parts else ""
            if version:
                candidate = folder / f"{name}.{version}.module"
                if candidate.is_file():
                    return candidate
                continue
            newest = _newest(folder, name)
            if newest is not None:
                return newest
        return None


_PARSED: dict[Path, tuple[float, ast.Program]] = {}


def _parse_file(file: Path) -> ast.Program:
    """Parse an imported file, reusing the AST while the file is unchanged."""
    stamp = file.stat().st_mtime
    cached = _PARSED.get(file)
    if cached is None or cached[0] != stamp:
        if file.suffix == ".py":
            from modeldsl.frontend.python.translate import parse_python_file

            cached = (stamp, parse_python_file(file))
        else:
            cached = (stamp, parse_source(read_source(file), str(file)))
        _PARSED[file] = cached
    return cached[1]


def _roots(stem: list[str], base: Path) -> list[tuple[Path, list[str]]]:
    """Where a dotted path may live: ``std.x`` in the standard library first; any
    path beside the importing file, then in the working folder; and a path without
    the ``std.`` prefix (``import primitives``, spec 4.7) last in the standard library,
    so that a project's own ``models/llama.module`` is not hidden by the std one."""
    roots: list[tuple[Path, list[str]]] = []
    if stem and stem[0] == "std":
        roots.append((STD_ROOT, stem[1:]))
    roots.append((base, stem))
    roots.append((Path.cwd(), stem))
    if stem and stem[0] != "std":
        roots.append((STD_ROOT, stem))
    return roots


def _stem(path: Path) -> str:
    """``matmul`` of ``matmul.module`` and of ``matmul.v1.module``."""
    parts = path.name.split(".")
    return ".".join(parts[:-2]) if len(parts) >= 3 and VERSION.match(parts[-2]) else ".".join(parts[:-1])


def _newest(folder: Path, name: str) -> Path | None:
    plain = folder / f"{name}.module"
    versions = sorted(
        (int(VERSION.match(p.name.split(".")[-2]).group(1)), p)
        for p in folder.glob(f"{name}.v*.module")
        if VERSION.match(p.name.split(".")[-2])
    ) if folder.is_dir() else []
    if plain.is_file():
        return plain
    if versions:
        return versions[-1][1]
    python = folder / f"{name}.py"  # the Python DSL's file
    return python if python.is_file() else None


def std_module_declaring(name: str) -> str | None:
    """The dotted std path of the file that declares module/block/model ``name`` (for an
    "import it from ..." hint), or None."""
    for file in sorted(STD_ROOT.rglob("*.module")):
        if "primitives" in file.parts or VERSION.match(file.name.split(".")[-2]):
            continue
        try:
            program = _parse_file(file)
        except DiagnosticError:
            continue
        if any(d.name == name and d.kind in ("module", "block", "model") for d in program.declarations):
            return ".".join(["std", *file.relative_to(STD_ROOT).with_suffix("").parts])
    return None


def namespace_key(decl: ast.Decl, name: str | None = None) -> str:
    """The name a declaration is visible by: ``@name`` for an ``annotation @name:``
    declaration (annotations and modules do not shadow each other)."""
    name = name or decl.name
    return f"@{name}" if decl.kind == "annotation" else name


def qualified_path(node: ast.Expr) -> list[str] | None:
    """``a.b.C`` as ["a", "b", "C"]; None for anything but names joined by dots."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.base
    if not isinstance(node, ast.Name) or not parts or node.id == "saved":
        return None
    return [node.id, *reversed(parts)]


def _qualified_calls(program: ast.Program) -> list[tuple[ast.Call, list[str]]]:
    """Calls with a dotted callee anywhere in the program's declarations, with the callee's
    path (walked without recursion)."""
    calls, stack = [], list(program.declarations)
    while stack:
        node = stack.pop()
        path = qualified_path(node.func) if isinstance(node, ast.Call) else None
        if path is not None:
            calls.append((node, path))
        for value in vars(node).values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, ast.Node):
                    stack.append(item)
    return calls


def resolve_program(program: ast.Program, sink: DiagnosticSink) -> ResolvedProgram:
    return Resolver(sink).resolve(program)
