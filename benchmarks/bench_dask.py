"""Benchmark the Dask executor against the local one, measured in the same run.

Per-unit overhead of 1,000 no-op units (a listed fan-out of ``true``) on a
2-worker ``--executor dask-local`` cluster vs ``--executor local``, both with
``-j 2``: (run duration − the one-unit run's duration) / units, from the
``run_finished`` event (the dispatcher's run, without interpreter start and,
for Dask, without cluster start). Target (issue 19): at most 3x local.

The two executors alternate over ROUNDS rounds and each keeps its best round,
so a burst of load on a shared machine does not land on one side only. The
CPU time per unit (user + system of the dispatcher and everything it started:
cluster, workers, tasks) is printed beside it, as a figure less sensitive to
other load than the wall time (no budget).

Usage: python benchmarks/bench_dask.py [UNITS [ROUNDS]]. Prints one line per
figure; exits 1 over budget; skips (exit 0, saying so) without Dask installed.
"""

from __future__ import annotations

import importlib.util
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

UNITS = 1000
ROUNDS = 3
BUDGET = 3.0
DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")
EXECUTORS = ("local", "dask-local")

PACK = """edition = 4
[workflow]
name = "noop"
[[workflow.task]]
name = "t"
map = {{ count = {n} }}
run = ["true"]
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(root: Path, n: int, executor: str, tag: str) -> tuple[float, float]:
    """(the run's duration, CPU seconds of the whole command's process tree)."""
    pack = root / f"pack{n}.toml"
    pack.write_text(PACK.format(n=n))
    state = root / f"state-{executor}-{n}-{tag}"
    argv = [DISPATCH, str(pack), "--state", str(state), "-j", "2", "--executor", executor]
    if executor == "dask-local":
        argv += ["--workers", "2"]
    cpu = _children_cpu()
    subprocess.run(argv, check=True, capture_output=True, timeout=900)
    cpu = _children_cpu() - cpu
    lines = (state / "session.jsonl").read_text().splitlines()
    finished = [json.loads(x) for x in lines if '"run_finished"' in x]
    return float(finished[-1]["duration"]), cpu


def main() -> int:
    if importlib.util.find_spec("distributed") is None:
        print("bench_dask: skipped: dask[distributed] is not installed")
        return 0
    units = int(sys.argv[1]) if len(sys.argv) > 1 else UNITS
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else ROUNDS
    wall: dict[str, list[float]] = {e: [] for e in EXECUTORS}
    cpu: dict[str, list[float]] = {e: [] for e in EXECUTORS}
    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp:
        root = Path(tmp)
        for r in range(rounds):
            for executor in EXECUTORS:
                base, base_cpu = run_once(root, 1, executor, str(r))
                full, full_cpu = run_once(root, units, executor, str(r))
                wall[executor].append(max(full - base, 1e-9) / (units - 1))
                cpu[executor].append(max(full_cpu - base_cpu, 1e-9) / (units - 1))
                print(
                    f"bench_dask: round {r + 1}: {executor}: {units} no-op units in {full:.2f}s"
                    f" ({wall[executor][-1] * 1000:.2f} ms/unit,"
                    f" {cpu[executor][-1] * 1000:.2f} ms CPU/unit)"
                )
    best = {e: min(v) for e, v in wall.items()}
    cpu_best = {e: min(v) for e, v in cpu.items()}
    ratio = best["dask-local"] / best["local"]
    ok = ratio <= BUDGET
    print(
        f"bench_dask: best of {rounds}: local {best['local'] * 1000:.2f} ms/unit,"
        f" dask-local {best['dask-local'] * 1000:.2f} ms/unit;"
        f" CPU per unit dask-local/local = {cpu_best['dask-local'] / cpu_best['local']:.2f}x"
    )
    print(f"bench_dask: per-unit overhead dask-local/local = {ratio:.2f}x (budget {BUDGET}x)"
          f" {'ok' if ok else 'OVER'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
