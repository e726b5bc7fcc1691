"""Benchmark the Dask executor against the local one, measured in the same run.

Per-unit overhead of 1,000 no-op units (a listed fan-out of ``true``) on a
2-worker ``--executor dask-local`` cluster vs ``--executor local``, both with
``-j 2``: (run duration − the one-unit run's duration) / units, from the
``run_finished`` event (the dispatcher's run, without interpreter start and,
for Dask, without cluster start). Target (issue 19): at most 3x local.

Usage: python benchmarks/bench_dask.py [UNITS]. Prints one line per figure;
exits 1 over budget; skips (exit 0, saying so) without Dask installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

UNITS = 1000
BUDGET = 3.0
DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")

PACK = """edition = 4
[workflow]
name = "noop"
[[workflow.task]]
name = "t"
map = {{ count = {n} }}
run = ["true"]
"""


def run_duration(root: Path, n: int, executor: str) -> float:
    pack = root / f"pack{n}.toml"
    pack.write_text(PACK.format(n=n))
    state = root / f"state-{executor}-{n}"
    argv = [DISPATCH, str(pack), "--state", str(state), "-j", "2", "--executor", executor]
    if executor == "dask-local":
        argv += ["--workers", "2"]
    subprocess.run(argv, check=True, capture_output=True, timeout=900)
    lines = (state / "session.jsonl").read_text().splitlines()
    finished = [json.loads(x) for x in lines if '"run_finished"' in x]
    return float(finished[-1]["duration"])


def main() -> int:
    if importlib.util.find_spec("distributed") is None:
        print("bench_dask: skipped: dask[distributed] is not installed")
        return 0
    units = int(sys.argv[1]) if len(sys.argv) > 1 else UNITS
    per_unit: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp:
        root = Path(tmp)
        for executor in ("local", "dask-local"):
            base = run_duration(root, 1, executor)
            full = run_duration(root, units, executor)
            per_unit[executor] = max(full - base, 1e-9) / (units - 1)
            print(
                f"bench_dask: {executor}: {units} no-op units in {full:.2f}s"
                f" ({per_unit[executor] * 1000:.2f} ms/unit)"
            )
    ratio = per_unit["dask-local"] / per_unit["local"]
    ok = ratio <= BUDGET
    print(f"bench_dask: per-unit overhead dask-local/local = {ratio:.2f}x (budget {BUDGET}x)"
          f" {'ok' if ok else 'OVER'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
