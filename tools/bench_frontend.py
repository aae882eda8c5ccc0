"""Benchmark (not a test): time to parse, check and lower the std Llama model.

Prints the time for the Llama-2-7B configuration (32 layers) and for other
depths, to show that the frontend's cost is flat in ``n_layers`` (stacked
blocks are one body). Run: ``python -m modeldsl.tools.bench_frontend``.
"""

from __future__ import annotations

import statistics
import sys
import time

from modeldsl.frontend.text.parser import parse_source
from modeldsl.lower import lower_program
from modeldsl.resolve.imports import STD_ROOT


def measure(n_layers: int, repeats: int = 5) -> tuple[float, float, int]:
    """Median seconds to parse and to parse+check+lower, and the number of IR ops."""
    path = STD_ROOT / "models" / "llama.module"
    text = path.read_text()
    parse_times, total_times, ops = [], [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        program = parse_source(text, str(path))
        parsed = time.perf_counter()
        module = lower_program(program, "Llama", {"n_layers": n_layers})
        done = time.perf_counter()
        parse_times.append(parsed - start)
        total_times.append(done - start)
        ops = sum(1 for _ in module.walk())
    return statistics.median(parse_times), statistics.median(total_times), ops


def main() -> int:
    print(f"{'n_layers':>8} {'parse ms':>9} {'parse+check+lower ms':>21} {'IR ops':>7}")
    results = {}
    for n_layers in (1, 32, 128):
        parse_s, total_s, ops = measure(n_layers)
        results[n_layers] = total_s
        label = " (Llama-2-7B)" if n_layers == 32 else ""
        print(f"{n_layers:>8} {parse_s * 1e3:>9.1f} {total_s * 1e3:>21.1f} {ops:>7}{label}")
    print(f"ratio 128 layers / 1 layer: {results[128] / results[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
