"""The Module DSL parser's cache: built once, loaded after, rebuilt when anything it depends on
changes or the file is damaged, and never in the way where the folder cannot be written."""

from __future__ import annotations

import os

import pytest

from modeldsl.frontend.text import parser, parser_cache
from modeldsl.frontend.text.parser_cache import KEPT, PREFIX, SUFFIX, cache_key, cached_parser

SOURCE = """model M(d: int = 4):
  params:
    w: [d, d]
  forward:
    in: [B, d]
    out: [B, d]
    graph:
      in -> matmul(w) -> out
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of this test's own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(parser_cache.CACHE_ENV_VAR, str(folder))
    return folder


def grammar() -> str:
    return parser.GRAMMAR.read_text()


def builder_source() -> bytes:
    return open(parser.__file__, "rb").read()


def cached(build=None):
    return cached_parser(grammar(), builder_source(), build or (lambda: parser._build_parser(grammar())))


def saved(folder):
    return sorted(folder.glob(f"{PREFIX}*{SUFFIX}"))


def not_built():
    raise AssertionError("built again although the cache holds the parser")


def test_the_parser_is_built_once_and_then_loaded_and_parses_alike(cache):
    built = cached()
    assert len(saved(cache)) == 1
    loaded = cached(not_built)
    assert loaded is not built and loaded.parse(SOURCE) == built.parse(SOURCE)
    assert type(loaded.options.postlex) is parser.ModuleDslIndenter


def test_the_key_changes_with_the_grammar_and_the_builder():
    key = cache_key("start: A", b"source")
    assert key != cache_key("start: B", b"source") and key != cache_key("start: A", b"source 2")
    assert key == cache_key("start: A", b"source")


def test_a_damaged_file_is_rebuilt_and_replaced(cache):
    cached()
    (path,) = saved(cache)
    path.write_bytes(path.read_bytes()[:1000])
    builds = []
    cached(lambda: builds.append(1) or parser._build_parser(grammar())).parse(SOURCE)
    assert builds == [1] and path.stat().st_size > 1000
    cached(not_built)


def test_a_folder_that_cannot_be_written_leaves_the_parser_built_each_time(cache):
    cache.write_text("a file where the folder would be")
    builds = []
    for _ in range(2):
        cached(lambda: builds.append(1) or parser._build_parser(grammar())).parse(SOURCE)
    assert builds == [1, 1] and cache.is_file()


def test_older_saves_beyond_the_newest_few_are_removed(cache):
    cache.mkdir()
    for k in range(KEPT + 2):
        old = cache / f"{PREFIX}{k:064x}{SUFFIX}"
        old.write_bytes(b"old")
        os.utime(old, (1000 + k, 1000 + k))
    other = cache / "cpu-kernels-0.so"
    other.write_bytes(b"kept")
    cached()
    names = [p.name for p in saved(cache)]
    assert len(names) == KEPT and f"{PREFIX}{0:064x}{SUFFIX}" not in names and other.exists()
