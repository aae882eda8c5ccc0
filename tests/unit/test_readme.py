"""The README and docs/ say what works: their examples run as written and print what they show.

Every command of a ```sh block in the README runs from the repository's root
(in a scratch folder that links the repository's entries, so what the commands
write lands there) and exits 0, but those in SKIPPED, which say why; the
Python blocks run too; the Module DSL example is the file it names and lowers
to the IR shown; the main job prints what the README shows, up to the
timings. IR blocks of the README and docs/ parse and verify; links to the
spec point at the section they name; no runnable block uses a placeholder.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from modeldsl.ir import make_context, parse_module, verify_module

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SPEC = ROOT / "docs" / "spec" / "module-dsl.txt"
SETUP_STEPS = ("python3 -m venv .venv", ". .venv/bin/activate", "pip install -e .")
MAIN_JOB = ('python3 -m venv .venv && . .venv/bin/activate && pip install -e . && mdsl-run '
            'modeldsl/std/models/llama.module --hf examples/tiny_llama --prompt "Hello, world" --max-new-tokens 16')
SKIPPED = {  # command -> why test_readme_commands_run_as_written does not run it
    MAIN_JOB: "test_the_main_job_prints_what_the_readme_shows runs it",
    "mdsl-opt examples/residual_mlp.module": "test_the_dsl_example_is_the_file_and_lowers_to_the_ir_shown runs it",
    "bash .ci/run": "it is CI itself: it runs these tests",
    "python -m modeldsl.tools.bench_memory": "about 40 s; tests/unit/tools/test_bench_memory.py covers it",
    "python -m modeldsl.tools.bench_lora": "about 3 min; tests/unit/tools/test_bench_lora.py runs it --quick",
    "python -m modeldsl.tools.bench --device cpu --shapes tiny --runners modeldsl,eager --batch 2 --seq 32":
        "about 10 s; tests/unit/tools/test_bench.py runs the same harness smaller",
    "python -m modeldsl.tools.bench_cpu --threads 2":
        "about 10 min; tests/unit/tools/test_bench_cpu.py runs the same harness on the tiny Llama",
    "python -m modeldsl.tools.bench_load":
        "about 4 min and 25 GB of checkpoints; tests/unit/tools/test_bench_load.py runs the same harness"
        " on a tiny shape",
}
# words that stand for something the reader must fill in
PLACEHOLDER = re.compile(r"\b(DIR|FILE|MODEL|OUT|DATA|NAME|PATH)\b|\.\.\.|<[a-z_]+>")


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.S | re.M)


def commands(block: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip() and
            not line.lstrip().startswith("#")]


def readme_commands() -> list[str]:
    return [command for block in blocks(README, "sh") for command in commands(block)]


def runnable_part(command: str) -> str:
    """The command without the set-up steps (a virtualenv and an install: the tests run in one)."""
    return " && ".join(part.strip() for part in command.split("&&") if part.strip() not in SETUP_STEPS)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A working folder that looks like the repository's root but keeps what the commands write."""
    folder = tmp_path_factory.mktemp("repo")
    for entry in ROOT.iterdir():
        if entry.name not in ("out", ".git") and not entry.name.endswith(".png"):
            (folder / entry.name).symlink_to(entry)
    return folder


def run_in(folder: Path, command: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ commands and code
def test_the_readme_keeps_the_two_set_up_commands():
    setup = README.read_text().split("## Set up", 1)[1]
    first, second = (commands(block) for block in re.findall(r"```sh\n(.*?)```", setup, re.S)[:2])
    assert first == [MAIN_JOB]
    assert second == ["bash .ci/run"]


@pytest.mark.parametrize("command", readme_commands(), ids=lambda command: command[:60])
def test_readme_commands_run_as_written(command, scratch):
    if command in SKIPPED:
        pytest.skip(SKIPPED[command])
    result = run_in(scratch, ["bash", "-c", runnable_part(command)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("snippet", blocks(README, "python"))
def test_readme_python_runs_as_written(snippet, scratch):
    result = run_in(scratch, [sys.executable, "-c", snippet])
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_runnable_blocks_use_no_placeholders_and_existing_files(page):
    for block in blocks(page, "sh") + blocks(page, "python"):
        for command in commands(block):
            assert not PLACEHOLDER.search(command), f"{page.name}: placeholder in '{command}' (use a ```text synopsis)"
            for word in re.findall(r"(?:^|\s|\")((?:modeldsl|examples|tests|tools|docs)/[\w./-]+)", command):
                assert (ROOT / word).exists(), f"{page.name}: '{command}' names {word}, which does not exist"


# ------------------------------------------------------------------ what the README shows
def test_the_dsl_example_is_the_file_and_lowers_to_the_ir_shown(scratch):
    text = README.read_text().split("## A model in the Module DSL", 1)[1]
    (source,) = re.findall(r"```module\n(.*?)```", text, re.S)[:1]
    assert source == (ROOT / "examples" / "residual_mlp.module").read_text()
    shown = re.findall(r"```mlir\n(.*?)```", text, re.S)[0]
    result = run_in(scratch, ["mdsl-opt", "examples/residual_mlp.module"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown


def test_the_python_dsl_example_is_the_file_and_lowers_to_the_same_ir(scratch):
    text = README.read_text().split("## A model in the Module DSL", 1)[1]
    (source,) = re.findall(r"```python\n(.*?)```", text.split("\n## ", 1)[0], re.S)  # this section's only
    assert source == (ROOT / "examples" / "residual_mlp.py").read_text()
    shown = re.findall(r"```mlir\n(.*?)```", text, re.S)[0]
    result = run_in(scratch, ["mdsl-opt", "examples/residual_mlp.py"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown


def masked(line: str) -> str:
    """A line of mdsl-run's output with its timings as a pattern."""
    return re.sub(r"\\ ms|\d+(?:\\\.\d+)?", lambda m: m.group(0) if m.group(0) == "\\ ms" else r"[\d.]+",
                  re.escape(line)) if line.startswith(("prefill:", "decode:")) else re.escape(line)


def test_the_main_job_prints_what_the_readme_shows(scratch):
    text = README.read_text().split("## Set up", 1)[1]
    command = runnable_part(commands(re.findall(r"```sh\n(.*?)```", text, re.S)[0])[0])
    shown = re.findall(r"```text\n(.*?)```", text, re.S)[0].splitlines()
    result = run_in(scratch, ["bash", "-c", command])
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert len(printed) == len(shown) == 4
    for line, expected in zip(printed, shown):
        assert re.fullmatch(masked(expected), line), (line, expected)
    assert "error" not in result.stderr and "warning" not in result.stderr


# ------------------------------------------------------------------ IR and links
SNIPPETS = [(page.name, snippet) for page in [README, *DOCS] for snippet in blocks(page, "mlir")]


def test_readme_and_docs_have_ir_examples():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("page, snippet", SNIPPETS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(SNIPPETS)])
def test_ir_examples_verify(page, snippet):
    module, spans = parse_module(make_context(), snippet, page)
    assert verify_module(module, spans) == []


def test_spec_links_point_at_the_sections_they_name():
    spec = SPEC.read_text().splitlines()
    links = [(page, *link) for page in [README, *DOCS]
             for link in re.findall(r"\[([^\]]+)\]\((?:docs/)?spec/module-dsl\.txt#L(\d+)\)", page.read_text())]
    assert len(links) >= 3
    for page, label, line in links:
        heading = re.fullmatch(r"#+ ([\dA-Z][\d.]*?)\.? (.+)", spec[int(line) - 1])
        label = " ".join(label.split())
        assert heading, (page.name, label, f"line {line} is no section heading")
        number, title = heading.groups()
        assert number in label and title in label, (page.name, label, spec[int(line) - 1])


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_exist(page):
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links {target}, which does not exist"
