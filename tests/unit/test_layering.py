"""The layers of modeldsl (docs/internals.md, "Layers"), checked on the static import graph of
:mod:`module_imports` (every import, those inside functions too):

- dialects (``dialects/``, ``modeldsl.dialects``) import no pass, runtime or tool;
- passes (``passes/``, ``modeldsl.passes``) import no runtime or tool;
- kernels (``kernels/``, ``modeldsl.kernels``) import no runtime;
- frontends (``modeldsl.frontend``) import no pass.

The test fails for any import that crosses a layer, with its lines.
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


def test_no_layer_imports_one_it_must_not():
    found = violations()
    assert not found, "imports across layers:\n" + "\n".join(
        f"  {importer} imports {imported} (line {', '.join(map(str, lines))})"
        for (importer, imported), lines in found.items())
