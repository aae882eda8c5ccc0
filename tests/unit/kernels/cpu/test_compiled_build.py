"""The first use of the compiled CPU kernels on a machine builds them, says so on stderr (a line
before, one with its time after), and is the only one that does; processes that build at once take
turns, so one builds and the others find it built."""

import threading
from pathlib import Path

import pytest

from modeldsl.kernels.cpu import compiled

BUILT = "built the CPU kernels in "


@pytest.fixture
def real_library() -> Path:
    """The library built in the usual cache (building it first where needed)."""
    if compiled.library() is None:
        pytest.skip("the compiled kernels do not build here (is ziglang installed?)")
    return compiled.library_path()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch, real_library):
    """An empty cache folder, and a build that links the real library there (no compile: fast).
    Returns the list of the targets it built."""
    built: list[Path] = []

    def link(target: Path) -> None:
        built.append(target)
        target.symlink_to(real_library)  # dlopen finds the library it already has

    monkeypatch.setenv(compiled.CACHE_ENV_VAR, str(tmp_path))
    monkeypatch.setattr(compiled, "build", link)
    compiled.library.cache_clear()
    yield built
    compiled.library.cache_clear()


def test_the_first_use_announces_the_build_and_a_later_one_says_nothing(fresh_cache, capsys):
    assert compiled.library() is not None
    first = capsys.readouterr().err.splitlines()
    assert first[0] == compiled.BUILDING and first[1].startswith(BUILT) and len(first) == 2
    compiled.library.cache_clear()  # a later process: the library is cached on disk
    assert compiled.library() is not None
    assert capsys.readouterr().err == "" and len(fresh_cache) == 1


def test_concurrent_first_uses_build_once(fresh_cache, capsys):
    target = compiled.library_path()
    start = threading.Barrier(4)

    def first_use() -> None:
        start.wait()
        compiled.build_once(target)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fresh_cache == [target]  # the lock let one build; the others found it built
    assert capsys.readouterr().err.count(compiled.BUILDING) == 1


def test_with_the_compiled_kernels_off_nothing_is_built(fresh_cache, monkeypatch, capsys):
    monkeypatch.setenv(compiled.ENV_VAR, "0")
    compiled.prepare()
    assert fresh_cache == [] and capsys.readouterr().err == ""
