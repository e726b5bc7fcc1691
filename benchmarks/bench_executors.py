"""The per-unit overhead of each executor on the same fan-out (issue 30).

200 no-op units (a fan-out of ``true``) with ``-j 2`` on ``--executor local``,
``dask-local`` (2 workers) and ``slurm`` (job arrays on the cluster this host
reaches: ci/slurm-up.sh's single node): (run duration − the one-unit run's
duration) / (units − 1), from the ``run_finished`` event. No budget: reported.

For slurm it also reports how the units were batched: the arrays (one
``sbatch`` each) and array elements the run used, what an element cost beyond
the one-unit run ((run − one-unit run) / elements; a batch of units per
element), and the one-unit run itself, which is about one scheduler round
trip (sbatch, scheduling, the element's start on its node, its answer): the
figure per element should be close to it, where a per-unit ``sbatch`` would
pay that round trip for every unit. Exits 1 only if slurm did not batch (an
element per unit). Skips slurm (saying so) where no cluster answers, and
dask-local without Dask installed.

Usage: python benchmarks/bench_executors.py [UNITS]
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

UNITS = 200
DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")

PACK = """edition = 4
[workflow]
name = "noop"
[[workflow.task]]
name = "t"
map = {{ count = {n} }}
run = ["true"]
"""


def slurm_answers() -> bool:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    done = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and bool(done.stdout.strip())


def run_once(root: Path, n: int, executor: str) -> tuple[float, list[dict[str, object]]]:
    """(the run's duration, its session events)."""
    pack = root / f"pack{n}.toml"
    pack.write_text(PACK.format(n=n))
    state = root / f"state-{executor}-{n}"
    argv = [DISPATCH, str(pack), "--state", str(state), "-j", "2", "--executor", executor]
    if executor == "dask-local":
        argv += ["--workers", "2"]
    subprocess.run(argv, check=True, capture_output=True, timeout=900)
    events = [json.loads(x) for x in (state / "session.jsonl").read_text().splitlines()]
    finished = [e for e in events if e["event"] == "run_finished"]
    return float(finished[-1]["duration"]), events  # type: ignore[arg-type]


def main() -> int:
    units = int(sys.argv[1]) if len(sys.argv) > 1 else UNITS
    executors = ["local"]
    if importlib.util.find_spec("distributed") is not None:
        executors.append("dask-local")
    else:
        print("bench_executors: dask-local skipped: dask[distributed] is not installed")
    if slurm_answers():
        executors.append("slurm")
    else:
        print(
            "bench_executors: slurm skipped: no SLURM cluster answers (ci/slurm-up.sh starts one)"
        )
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-executors-") as tmp:
        root = Path(tmp)
        for executor in executors:
            base, _ = run_once(root, 1, executor)
            full, events = run_once(root, units, executor)
            per_unit = max(full - base, 0.0) / (units - 1)
            print(
                f"bench_executors: {executor}: {units} no-op units in {full:.2f}s, one in"
                f" {base:.2f}s: {per_unit * 1000:.2f} ms/unit"
            )
            if executor != "slurm":
                continue
            elements = set()
            for e in events:
                if e["event"] == "task_started":
                    found = re.search(r"slurm job (\d+)_(\d+)", str(e.get("worker", "")))
                    if found:
                        elements.add((found.group(1), found.group(2)))
            arrays = {job for job, _ in elements}
            per_element = max(full - base, 0.0) / max(len(elements), 1)
            print(
                f"bench_executors: slurm: {len(arrays)} arrays (sbatch calls), {len(elements)}"
                f" elements for {units} units ({units / max(len(elements), 1):.1f} units each);"
                f" {per_element:.2f}s per element vs {base:.2f}s for a one-unit run (about one"
                f" scheduler round trip); a job per unit, 2 at a time, would take"
                f" ~{base * units / 2:.0f}s of round trips ({base * units / 2 / max(full, 1e-9):.0f}x"
                " this run)"
            )
            ok = len(elements) < units
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
