"""lit configuration: FileCheck tests of the dialects, passes and tools.

Substitutions: ``mdsl-opt`` (the driver), ``%roundtrip`` (parse, print,
re-parse custom and generic forms, check they agree, print) and ``filecheck``.
"""

import os
import shutil

import lit.formats

config.name = "modeldsl"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir", ".module", ".py"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Inputs"]

# Run the tools of the Python environment that runs lit.
config.environment["PATH"] = os.pathsep.join(
    [os.path.dirname(shutil.which("mdsl-opt") or ""), os.environ.get("PATH", "")]
)
config.substitutions.append(("%roundtrip", "mdsl-roundtrip"))
