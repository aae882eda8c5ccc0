"""The Module DSL's LALR parser, kept built in the user's cache folder.

Lark builds the LALR tables of ``grammar.lark`` in about 0.2 s, a third of what a fresh
``mdsl-opt model.module`` takes to parse, check, lower and print a small model; the built parser
(``Lark.save``) loads in about 20 ms. :func:`cached_parser` keeps it in ``$MDSL_CACHE_DIR``
(else ``~/.cache/modeldsl``, beside the built CPU kernels) under a name that is the SHA-256 of
everything the tables depend on: the grammar, the source of the module that builds the parser
(its options and its post-lexer) and the versions of Lark and Python. A changed grammar or an
upgrade builds and saves a new file; older files beyond the newest :data:`KEPT` are removed
(other checkouts may use other grammars). The file is written atomically
(:func:`modeldsl.files.write_file`), so a concurrent process never reads half of one; a file
that does not load is rebuilt and replaced; where the folder cannot be written, the parser is
built each time, as without the cache.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path

import lark
from lark import Lark

from modeldsl.files import write_file

CACHE_ENV_VAR = "MDSL_CACHE_DIR"  # the folder of modeldsl.kernels.cpu.compiled's libraries too
PREFIX = "module-dsl-parser-"
SUFFIX = ".lark.pickle"
KEPT = 4  # cached parsers kept per folder (the newest)


def cache_folder() -> Path:
    """``$MDSL_CACHE_DIR``, else ``~/.cache/modeldsl``."""
    given = os.environ.get(CACHE_ENV_VAR)
    return Path(given) if given else Path.home() / ".cache" / "modeldsl"


def cache_key(grammar: str, builder_source: bytes) -> str:
    """The SHA-256 of what the built tables depend on."""
    digest = hashlib.sha256()
    for part in (grammar.encode("utf-8"), builder_source, lark.__version__.encode(),
                 sys.version.split()[0].encode()):
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


def cached_parser(grammar: str, builder_source: bytes, build: Callable[[], Lark]) -> Lark:
    """The parser ``build()`` makes, loaded from the cache folder where it was saved before."""
    try:
        path = cache_folder() / f"{PREFIX}{cache_key(grammar, builder_source)}{SUFFIX}"
    except RuntimeError:  # no home folder to cache in
        return build()
    parser = _load(path)
    if parser is None:
        parser = build()
        _save(parser, path)
    return parser


def _load(path: Path) -> Lark | None:
    """The parser saved at ``path``; None where there is none or it does not load."""
    try:
        with open(path, "rb") as f:
            return Lark.load(f)
    except Exception:  # noqa: BLE001 - missing, unreadable, truncated or from another Lark: rebuild
        return None


def _save(parser: Lark, path: Path) -> None:
    """Save ``parser`` at ``path`` atomically and prune older saves; a folder that cannot be written is left be."""
    data = io.BytesIO()
    parser.save(data)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, data.getvalue())
    except OSError:
        return
    _prune(path.parent)


def _prune(folder: Path) -> None:
    """Remove all but the newest :data:`KEPT` saved parsers in ``folder``."""
    try:
        saved = sorted(folder.glob(f"{PREFIX}*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in saved[KEPT:]:
            old.unlink(missing_ok=True)
    except OSError:
        return
