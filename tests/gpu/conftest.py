"""Make the GPU tests' helpers (harness.py, emulator/) importable."""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "emulator"))
