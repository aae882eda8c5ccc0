"""The layers of modeldsl (docs/internals.md, "Layers"), checked on the static import graph of
:mod:`module_imports` (every import, those inside functions too):

- dialects (``dialects/``, ``modeldsl.dialects``) import no pass, runtime or tool;
- passes (``passes/``, ``modeldsl.passes``) import no runtime or tool;
- kernels (``kernels/``, ``modeldsl.kernels``) import no runtime;
- frontends (``modeldsl.frontend``) import no pass.

The imports that still cross a layer are listed in ``KNOWN_VIOLATIONS_BEING_REMOVED``; the test
fails for a new one and for a listed one that is gone (delete its entry).
"""

from __future__ import annotations

from module_imports import Import, all_imports

RUNTIME, TOOLS, PASSES = "modeldsl.runtime", "modeldsl.tools", "modeldsl.passes"

# each layer and the layers it must not import
FORBIDDEN = {
    "modeldsl.dialects": (PASSES, RUNTIME, TOOLS),
    "modeldsl.passes": (RUNTIME, TOOLS),
    "modeldsl.kernels": (RUNTIME,),
    "modeldsl.frontend": (PASSES,),
}

KNOWN_VIOLATIONS_BEING_REMOVED = {
    # the CPU optimizer kernels read the launch attributes of the CPU schedule executor
    ("modeldsl.kernels.cpu.optim", "modeldsl.runtime.sched_executor"),
}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def crosses(imp: Import) -> bool:
    """Whether an import goes from a layer to one it must not import."""
    return any(within(imp.importer, layer) and any(within(imp.imported, other) for other in banned)
               for layer, banned in FORBIDDEN.items())


def violations() -> dict[tuple[str, str], list[int]]:
    """Each import across a layer (module, imported module), with its lines."""
    found: dict[tuple[str, str], list[int]] = {}
    for imp in all_imports():
        if not imp.implicit and crosses(imp):
            found.setdefault((imp.importer, imp.imported), []).append(imp.line)
    return found


def test_crosses_judges_by_package_not_by_name_prefix():
    assert crosses(Import("modeldsl.passes.fuse.common", "modeldsl.runtime.model", 1))
    assert crosses(Import("modeldsl.dialects.graph", "modeldsl.tools.opt", 1))
    assert not crosses(Import("modeldsl.passes.fuse", "modeldsl.runtimes", 1))
    assert not crosses(Import("modeldsl.frontend.text.parser", "modeldsl.dialects.graph", 1))
    assert not crosses(Import("modeldsl.tools.opt", "modeldsl.passes.registry", 1))


def test_no_layer_imports_one_it_must_not_beyond_the_known_ones():
    new = {k: v for k, v in violations().items() if k not in KNOWN_VIOLATIONS_BEING_REMOVED}
    assert not new, "imports across layers:\n" + "\n".join(
        f"  {importer} imports {imported} (line {', '.join(map(str, lines))})"
        for (importer, imported), lines in new.items())


def test_each_known_violation_is_still_there():
    gone = sorted(KNOWN_VIOLATIONS_BEING_REMOVED - set(violations()))
    assert not gone, f"fixed: remove them from KNOWN_VIOLATIONS_BEING_REMOVED: {gone}"
