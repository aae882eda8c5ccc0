"""``mdsl-build-kernels``: compile the CUDA kernels (``kernels/*.cu``) to cubin.

Every ``kernels/<family>.cu`` is compiled with ``nvcc -cubin -arch=<arch> -O3
-std=c++17`` for each target architecture (``sm_80`` and ``sm_90a`` by
default). No ``--use_fast_math``: the kernels are tested against the numpy
references at fp32 rtol 1e-5, which approximate exp/log/division would not
keep. Cubins are cached under ``$MDSL_KERNEL_CACHE``, else
``$XDG_CACHE_HOME/modeldsl/kernels``, else ``~/.cache/modeldsl/kernels``, named
by a hash of the source (and the ``*.cuh`` headers beside it), the nvcc
version, the flags and the architecture, so an edited kernel or another
compiler builds anew and an unchanged one is never compiled twice.

Python API: :func:`cubin_path` (``cubin_path("rmsnorm", "sm_90a")`` builds on
first use when the cubin is missing) and :func:`build`. Command line::

    mdsl-build-kernels [FAMILY | FILE.cu ...] [--arch sm_80 --arch sm_90a] [--cache-dir DIR]
                       [--force] [--jobs N] [--diagnostics-format text|json]

Compile errors are coded diagnostics (E035) at the ``.cu`` file and line nvcc
reports, with the source line and a caret; a missing nvcc is E028 with a hint
(``$MDSL_NVCC`` or ``$CUDA_HOME`` point at one off the ``PATH``); bad flags
are E029. The exit code is 1 on any error, never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from modeldsl.diagnostics import Diagnostic, DiagnosticError, Source, Span, render_all

ARCHS = ("sm_80", "sm_90a")
FLAGS = ("-O3", "-std=c++17")
REPORT_FLAGS = ("--resource-usage",)  # ptxas's registers/shared memory/spills per kernel: the .usage.json
SOURCE_DIR = Path(__file__).resolve().parent.parent / "kernels"
BUILD_FAILED = "E035"  # CUDA kernel build failed (a compile error)
NVCC_TIMEOUT_S = 600
CUDA_HOMES = ("/usr/local/cuda",)  # searched after $CUDA_HOME and $CUDA_PATH when nvcc is not on the PATH


def _kernel_sources() -> Path:
    """The folder of the kernel sources: the ``modeldsl.kernels`` package (the repository's ``kernels/``)."""
    try:
        import modeldsl.kernels as package

        return Path(package.__file__).resolve().parent
    except ImportError:  # pragma: no cover - only outside an installed modeldsl
        return SOURCE_DIR


def default_cache_dir() -> Path:
    """``$MDSL_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/modeldsl/kernels``, else ``~/.cache/modeldsl/kernels``."""
    if os.environ.get("MDSL_KERNEL_CACHE"):
        return Path(os.environ["MDSL_KERNEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "modeldsl" / "kernels"


def find_nvcc() -> str:
    """The nvcc to use: ``$MDSL_NVCC``, else ``nvcc`` on the PATH, else ``$CUDA_HOME/bin/nvcc``; E028 when none."""
    explicit = os.environ.get("MDSL_NVCC")
    if explicit:
        if shutil.which(explicit):
            return shutil.which(explicit)
        raise DiagnosticError([Diagnostic("E028", f"MDSL_NVCC names '{explicit}', which is not an executable", None,
                                          "point MDSL_NVCC at nvcc, or unset it to use the nvcc on the PATH")])
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *CUDA_HOMES):
        if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
            return str(Path(home) / "bin" / "nvcc")
    raise DiagnosticError([Diagnostic(
        "E028", "nvcc not found: the CUDA kernels cannot be compiled", None,
        "install the CUDA toolkit (12.0 or newer) and put its bin/ on the PATH, or set MDSL_NVCC=/path/to/nvcc "
        "or CUDA_HOME")])


@lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """The full ``nvcc --version`` text (part of the cache key)."""
    try:
        done = subprocess.run([nvcc, "--version"], check=False, capture_output=True, text=True, timeout=60)
    except OSError as err:
        raise DiagnosticError([Diagnostic("E028", f"cannot run {nvcc}: {err.strerror or err}", None,
                                          "check the CUDA toolkit installation")]) from None
    if done.returncode != 0:
        raise DiagnosticError([Diagnostic("E028", f"{nvcc} --version failed: {done.stderr.strip()}", None,
                                          "check the CUDA toolkit installation")])
    return done.stdout.strip()


def resolve_source(name: str | Path) -> Path:
    """A family name (``rmsnorm``) or a path to a ``.cu`` file; E028 when there is no such source."""
    text = str(name)
    path = Path(text) if text.endswith(".cu") else _kernel_sources() / f"{text}.cu"
    if not path.is_file():
        known = ", ".join(families())
        where = f" ({path})" if path != Path(text) else ""
        raise DiagnosticError([Diagnostic("E028", f"no kernel source '{text}'{where}", None,
                                          f"kernel families: {known}")])
    return path.resolve()


def families() -> list[str]:
    """Every ``kernels/*.cu`` by family name."""
    return sorted(p.stem for p in _kernel_sources().glob("*.cu"))


def _cache_key(source: Path, arch: str, nvcc: str) -> str:
    digest = hashlib.sha256()
    for part in (nvcc_version(nvcc), " ".join(FLAGS + REPORT_FLAGS), arch):
        digest.update(part.encode() + b"\0")
    for path in [source, *sorted(source.parent.glob("*.cuh"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def cubin_file(source: Path, arch: str, cache_dir: Path, nvcc: str) -> Path:
    """Where the cubin of ``source`` for ``arch`` lives in the cache."""
    return cache_dir / f"{source.stem}.{arch}.{_cache_key(source, arch, nvcc)}.cubin"


@dataclass(frozen=True)
class BuildResult:
    source: Path
    arch: str
    cubin: Path
    cached: bool
    seconds: float
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.diagnostics


# nvcc's front end: "file(12): error: message" (also "catastrophic error", "warning #177-D");
# the next two lines are usually the source line and a caret under the column.
_NVCC_MESSAGE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<kind>error|catastrophic error|warning)[^:]*: "
                           r"(?P<message>.*)$")


def _display(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _caret_column(shown: list[str], original: str) -> int:
    """The 1-based column in ``original`` of the caret nvcc prints under its copy of the line
    (indented by two spaces, tabs expanded): matched by the text from the caret to the end."""
    if len(shown) < 2 or shown[1].strip() != "^":
        return 1
    at = shown[1].index("^")
    tail = shown[0][at:]
    if tail and original.endswith(tail):
        return len(original) - len(tail) + 1
    return max(1, at - 1)


def parse_nvcc_errors(output: str, source: Path) -> list[Diagnostic]:
    """Coded diagnostics (E035) for the errors in nvcc's output; one for the whole output when none
    has a location (ptxas, the driver)."""
    lines = output.splitlines()
    diagnostics: list[Diagnostic] = []
    for i, text in enumerate(lines):
        match = _NVCC_MESSAGE.match(text)
        if not match or match["kind"] == "warning":
            continue
        file = match["file"] if os.path.isabs(match["file"]) else str(source.parent / match["file"])
        line = int(match["line"])
        try:
            content = Path(file).read_text(encoding="utf-8", errors="replace")
        except OSError:
            content = ""
        column = _caret_column(lines[i + 1:i + 3], Source("", content).line(line))
        src = Source(_display(file), content)
        end = column + 1
        word = re.match(r"\w+", src.line(line)[column - 1:])
        if word:
            end = column + len(word.group(0))
        diagnostics.append(Diagnostic(BUILD_FAILED, f"CUDA compile error: {match['message'].strip()}",
                                      Span(src, line, column, line, end),
                                      "fix the kernel source; mdsl-build-kernels rebuilds only what changed"))
    if not diagnostics:
        detail = "\n".join(line for line in lines if line.strip())[-2000:] or "nvcc failed without a message"
        src = Source(_display(str(source)), source.read_text(encoding="utf-8", errors="replace"))
        diagnostics.append(Diagnostic(BUILD_FAILED, f"CUDA compile error in {src.name}:\n{detail}", None,
                                      "fix the kernel source, or check the nvcc flags and architecture"))
    return diagnostics


def usage_file(cubin: Path) -> Path:
    return cubin.with_suffix(".usage.json")


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


_ENTRY = re.compile(r"Compiling entry function '(?P<name>\w+)'")
_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
                    r"(?P<loads>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<registers>\d+) registers(?:, used (?P<barriers>\d+) barriers)?"
                   r"(?:, \d+ bytes cumulative stack size)?(?:, (?P<smem>\d+) bytes smem)?")


def parse_resource_usage(output: str) -> dict[str, dict[str, int]]:
    """Per kernel (ptxas ``--resource-usage``): registers, static shared memory, stack and spill bytes."""
    usage: dict[str, dict[str, int]] = {}
    current = None
    for line in output.splitlines():
        if m := _ENTRY.search(line):
            current = usage.setdefault(m["name"], {"registers": 0, "smem": 0, "stack": 0, "spill_stores": 0,
                                                   "spill_loads": 0})
        elif current is not None and (m := _FRAME.search(line)):
            current.update(stack=int(m["stack"]), spill_stores=int(m["stores"]), spill_loads=int(m["loads"]))
        elif current is not None and (m := _USED.search(line)):
            current.update(registers=int(m["registers"]), smem=int(m["smem"] or 0))
    return usage


def resource_usage(family: str, arch: str = "sm_90a", cache_dir: Path | None = None) -> dict[str, dict[str, int]]:
    """What ptxas reported for each kernel of ``family`` on ``arch`` (builds the cubin first when missing)."""
    return json.loads(usage_file(cubin_path(family, arch, cache_dir)).read_text())


def compile_cubin(source: Path, arch: str, cache_dir: Path, nvcc: str, force: bool = False) -> BuildResult:
    """Compile one source for one architecture into the cache (unless it is there already)."""
    target = cubin_file(source, arch, cache_dir, nvcc)
    if target.is_file() and usage_file(target).is_file() and not force:
        return BuildResult(source, arch, target, True, 0.0)
    cache_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{source.stem}.{arch}.", suffix=".cubin")
    os.close(fd)
    try:
        command = [nvcc, "-cubin", f"-arch={arch}", *FLAGS, *REPORT_FLAGS, "-o", tmp, str(source)]
        try:
            done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return BuildResult(source, arch, target, False, time.perf_counter() - start, (Diagnostic(
                BUILD_FAILED, f"nvcc took more than {NVCC_TIMEOUT_S} s on {_display(str(source))} ({arch})", None,
                "simplify the kernel or check the machine"),))
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            return BuildResult(source, arch, target, False, seconds,
                               tuple(parse_nvcc_errors(done.stdout + "\n" + done.stderr, source)))
        usage = json.dumps(parse_resource_usage(done.stdout + "\n" + done.stderr), indent=1, sort_keys=True)
        _write_atomic(usage_file(target), usage)
        os.replace(tmp, target)  # atomic: a concurrent reader sees the old cubin or the whole new one
        return BuildResult(source, arch, target, False, seconds)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build(sources: Iterable[str | Path] | None = None, archs: Sequence[str] = ARCHS, cache_dir: Path | None = None,
          force: bool = False, jobs: int | None = None) -> list[BuildResult]:
    """Compile sources (family names or ``.cu`` paths; default every family) for every arch, ``jobs``
    nvcc processes at a time. Compile errors come back in the results; a missing nvcc raises E028."""
    paths = [resolve_source(s) for s in (families() if sources is None else sources)]
    for arch in archs:
        if not re.fullmatch(r"sm_\d+[af]?", arch):
            raise DiagnosticError([Diagnostic("E029", f"--arch '{arch}' is not an architecture such as sm_90a",
                                              None, f"the defaults are {' '.join(ARCHS)}")])
    nvcc = find_nvcc()
    nvcc_version(nvcc)
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    work = [(path, arch) for path in paths for arch in archs]
    with ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda item: compile_cubin(item[0], item[1], cache, nvcc, force), work))


def cubin_path(family: str, arch: str = "sm_90a", cache_dir: Path | None = None) -> Path:
    """The cached cubin of ``family`` (a name or a ``.cu`` path) for ``arch``, compiled first when missing;
    DiagnosticError (E035 at the source line, E028 without nvcc) when it cannot be built."""
    (result,) = build([family], [arch], cache_dir, jobs=1)
    if not result.ok:
        raise DiagnosticError(list(result.diagnostics))
    return result.cubin


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 with usage text; we give E029
        raise DiagnosticError([Diagnostic("E029", f"mdsl-build-kernels: {message}", None,
                                          "see mdsl-build-kernels --help")])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mdsl-build-kernels", description="Compile kernels/*.cu to cubin (cached by source hash).")
    parser.add_argument("sources", nargs="*", metavar="FAMILY|FILE.cu",
                        help="kernel families (rmsnorm, ...) or .cu files; default: every kernels/*.cu")
    parser.add_argument("--arch", action="append", metavar="SM",
                        help=f"target architecture, repeatable (default: {' '.join(ARCHS)})")
    parser.add_argument("--cache-dir", type=Path, help="cubin cache (default: $MDSL_KERNEL_CACHE, "
                        "$XDG_CACHE_HOME/modeldsl/kernels or ~/.cache/modeldsl/kernels)")
    parser.add_argument("--force", action="store_true", help="compile even when the cache has the cubin")
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    parser.add_argument("--diagnostics-format", choices=("text", "json"), default="text")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise DiagnosticError([Diagnostic("E029", f"mdsl-build-kernels: --jobs must be at least 1, got {args.jobs}",
                                          None, "--jobs 2 runs two nvcc processes at a time")])
    start = time.perf_counter()
    results = build(args.sources or None, tuple(args.arch or ARCHS), args.cache_dir, args.force, args.jobs)
    failures = [d for r in results for d in r.diagnostics]
    for r in results:
        if r.ok:
            state = "cached" if r.cached else f"built in {r.seconds:.1f} s"
            print(f"{r.source.stem:16} {r.arch:7} {state:16} {r.cubin}")
    built = sum(1 for r in results if r.ok and not r.cached)
    cached = sum(1 for r in results if r.cached)
    print(f"{len(results)} cubins: {built} built, {cached} cached, {len(results) - built - cached} failed "
          f"({time.perf_counter() - start:.1f} s)")
    if failures:
        raise DiagnosticError(failures)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    fmt = "json" if argv is not None and "--diagnostics-format=json" in argv else "text"
    try:
        args = build_parser().parse_args(argv)
        fmt = args.diagnostics_format
        return run(args)
    except DiagnosticError as err:
        sys.stderr.write(render_all(err.diagnostics, fmt) + ("\n" if fmt == "text" else ""))
        return 1
    except KeyboardInterrupt:
        print("mdsl-build-kernels: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - a bug, but still no traceback for users
        if os.environ.get("MDSL_DEBUG"):
            raise
        print(f"mdsl-build-kernels: internal error: {type(err).__name__}: {err}\n"
              "hint: this is a bug in modeldsl; rerun with MDSL_DEBUG=1 for a traceback and report it",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
