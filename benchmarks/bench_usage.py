"""What recording each attempt's usage costs (issue 29): bench_dispatch's
1,000-task figure with usage recorded against the same dispatcher with the
recording switched off, in the same process, rounds interleaved.

The figures come from the ``wait4`` that reaps each task's leader anyway
(crucible.run._procs: ``waitpid`` is ``wait4`` without the rusage pointer in
the kernel); what recording adds is a ``getrusage`` of the worker after each
spawn, turning the rusage into eight members, and the bytes of those members
in the record and in ``task_finished``. The baseline is the same
``crucible-dispatch`` with :func:`crucible.run._usage.from_rusage` answering
None (no member anywhere) and no ``getrusage`` after the spawn: everything
else, start-up included, is the same program.

Budget: the median wall time with usage within 3 % of the median without it
(a ratio measured here, never an absolute time). The CPU time of the whole
process tree is printed beside it (steadier on a shared machine).

Run: python benchmarks/bench_usage.py [--tasks N] [--repeat R] [--settle SECONDS]
Exits 1 if the budget is exceeded.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_dispatch import _children_cpu, _compile_bytecode, fresh, settle, write_pack

#: with usage recorded, at most this much slower than without (issue 29)
BUDGET = 1.03

_MAIN = "import sys\nfrom crucible.run.cli import main\nsys.exit(main())\n"
#: the same program with usage recording switched off (the baseline)
_WITHOUT = (
    "import crucible.run._procs as procs, crucible.run._unit as unit\n"
    "unit.from_rusage = lambda usage, spawner: None\n"
    "procs.self_peak_rss_kib = lambda: None\n"
) + _MAIN


def time_run(code: str, plan: Path, root: Path) -> tuple[float, float]:
    """(wall, CPU of the tree) of one dispatch of ``plan`` at -j 2."""
    state = fresh(root, "state")
    cpu = _children_cpu()
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code, str(plan), "--state", str(state), "-j", "2"],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t, _children_cpu() - cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--settle", type=float, default=420.0)
    args = ap.parse_args()
    _compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="bench-usage-") as tmp:
        root = Path(tmp)
        print(f"# inode creation now: {settle(root, args.settle):.1f} us per inode")
        plan = write_pack(root, args.tasks)
        time_run(_MAIN, plan, root)  # warm the page cache for both
        walls: dict[str, list[float]] = {"with": [], "without": []}
        cpus: dict[str, list[float]] = {"with": [], "without": []}
        for k in range(args.repeat):  # interleaved, alternating which goes first
            order = (("with", _MAIN), ("without", _WITHOUT))
            for name, code in order if k % 2 == 0 else order[::-1]:
                wall, cpu = time_run(code, plan, root)
                walls[name].append(wall)
                cpus[name].append(cpu)
        state = next(root.glob("state-*"))
        recorded = (state / "session.jsonl").read_text().count('"cpu_user_s"')
    w, wo = statistics.median(walls["with"]), statistics.median(walls["without"])
    c, co = statistics.median(cpus["with"]), statistics.median(cpus["without"])
    print(f"# {args.tasks} sh tasks at -j 2, median of {args.repeat} interleaved rounds")
    print(f"# (a run with usage recorded {recorded} task_finished events with it)")
    ratio = w / wo
    ok = ratio <= BUDGET
    print(
        f"wall with usage {w:.3f} s, without {wo:.3f} s: ratio {ratio:.3f}  "
        f"budget {BUDGET:g}  {'ok' if ok else 'OVER BUDGET'}"
    )
    print(f"CPU (tree, info) with usage {c:.3f} s, without {co:.3f} s: ratio {c / co:.3f}")
    print(f"  per task (info): {(c - co) / args.tasks * 1e6:+.1f} us CPU")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
