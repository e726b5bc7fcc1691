"""What recording each attempt's usage costs (issue 29): bench_dispatch's
1,000-task figure with usage recorded against the same dispatcher with the
recording switched off, in the same process, rounds interleaved.

The figures come from the ``wait4`` that reaps each task's leader anyway
(crucible.run.executors._procs: ``waitpid`` is ``wait4`` without the rusage pointer in
the kernel); what recording adds is a ``getrusage`` of the worker after each
spawn, turning the rusage into eight members, and the bytes of those members
in the record and in ``task_finished``. The baseline is the same
``crucible-dispatch`` with :func:`crucible.run.executors._usage.from_rusage` answering
None (no member anywhere) and no ``getrusage`` after the spawn: everything
else, start-up included, is the same program.

Budget: with usage, the median wall time within 3 % of the median without
it (a ratio measured here, never an absolute time; bench_dispatch's figure is
a median too). On a shared 2-core machine other processes' load moves one
run's wall time by seconds (seen: the same program 1.5 s, then 5.6 s, at load
11-16), so the fastest rounds' ratio, the median of the rounds' paired
ratios and the CPU time of the whole process tree are printed beside it, and
what recording adds per task measured in this process (the ``getrusage``
after a spawn, building the members, and encoding them in an event and a
record) as a share of a round's time per task: a figure no other process's
load moves much.

``--where tmpfs`` runs the rounds on a tmpfs instead of this machine's disk:
the figure without the no-journal ext4's inode penalty (bench_dispatch's
module doc), which another process deleting files here inflates by several
hundred microseconds a task, far more than what is measured.

Run: python benchmarks/bench_usage.py [--tasks N] [--repeat R] [--settle SECONDS]
     [--where disk|tmpfs]
Exits 1 if the budget is exceeded.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _tmpfs import tmpfs_dir
from bench_dispatch import _children_cpu, _compile_bytecode, fresh, settle, write_pack

#: with usage recorded, at most this much slower than without (issue 29)
BUDGET = 1.03

_MAIN = "import sys\nfrom crucible.run.cli import main\nsys.exit(main())\n"
#: the same program with usage recording switched off (the baseline)
_WITHOUT = (
    "import crucible.run.executors._procs as procs, crucible.run.executors._unit as unit\n"
    "unit.from_rusage = lambda usage, spawner: None\n"
    "procs.self_peak_rss_kib = lambda: None\n"
) + _MAIN


def added_per_task_us(rounds: int = 20_000) -> float:
    """Microseconds of CPU recording adds per task, measured here: the
    spawner's ``getrusage``, :func:`from_rusage` and the canonical JSON of an
    event's and a record's extra members (taken with the smallest of 5 runs)."""
    import resource

    from crucible.core import canon
    from crucible.run.executors._usage import from_rusage, self_peak_rss_kib

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    event = {"attempt": 1, "duration": 0.116621, "event": "task_finished", "exit_code": 0}
    event |= {"note": "", "session": 1, "status": "passed", "task": "t1", "time": "T"}
    members = from_rusage(usage, 16916)

    def work() -> None:
        self_peak_rss_kib()
        canon.dumps({**event, **from_rusage(usage, 16916)})
        canon.dumps({**event, "usage": members})

    def baseline() -> None:
        canon.dumps(event)
        canon.dumps(event)

    def best(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(5):
            t = time.process_time()
            for _ in range(rounds):
                fn()
            times.append(time.process_time() - t)
        return min(times) / rounds * 1e6

    return best(work) - best(baseline)


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
    ap.add_argument("--where", choices=("disk", "tmpfs"), default="disk")
    args = ap.parse_args()
    _compile_bytecode()
    place = (
        tmpfs_dir("bench-usage-")
        if args.where == "tmpfs"
        else contextlib.nullcontext((Path(tempfile.mkdtemp(prefix="bench-usage-")), "disk"))
    )
    with place as (root, where):
        print(f"# {where}: inode creation now: {settle(root, args.settle):.1f} us per inode")
        plan = write_pack(root, args.tasks)
        first = time_run(_MAIN, plan, root)  # warms the page cache for both
        del first
        state = next(root.glob("state-*"))  # that run's: usage recorded
        recorded = (state / "session.jsonl").read_text().count('"cpu_user_s"')
        walls: dict[str, list[float]] = {"with": [], "without": []}
        cpus: dict[str, list[float]] = {"with": [], "without": []}
        for k in range(args.repeat):  # interleaved, alternating which goes first
            order = (("with", _MAIN), ("without", _WITHOUT))
            for name, code in order if k % 2 == 0 else order[::-1]:
                wall, cpu = time_run(code, plan, root)
                walls[name].append(wall)
                cpus[name].append(cpu)
        if args.where == "disk":
            shutil.rmtree(root)
    w, wo = statistics.median(walls["with"]), statistics.median(walls["without"])
    c, co = statistics.median(cpus["with"]), statistics.median(cpus["without"])
    paired = statistics.median(
        a / b for a, b in zip(walls["with"], walls["without"], strict=True)
    )
    best, best_without = min(walls["with"]), min(walls["without"])
    print(f"# {where}: {args.tasks} sh tasks at -j 2, {args.repeat} interleaved rounds")
    print(f"# (a run with usage recorded {recorded} task_finished events with it)")
    ratio = w / wo
    ok = ratio <= BUDGET
    print(
        f"wall (median) with usage {w:.3f} s / without {wo:.3f} s: "
        f"{ratio:.3f}  budget {BUDGET:g}  {'ok' if ok else 'OVER BUDGET'}"
    )
    print(
        f"  (info) fastest rounds: with {best:.3f} s, without {best_without:.3f} s: "
        f"{best / best_without:.3f}; median of the rounds' ratios {paired:.3f}"
    )
    print(f"CPU (tree, info) with usage {c:.3f} s, without {co:.3f} s: ratio {c / co:.3f}")
    print(f"  per task (info): {(c - co) / args.tasks * 1e6:+.1f} us CPU")
    added = added_per_task_us()
    per_task = wo / args.tasks * 1e6
    print(
        f"added by recording, measured in-process: {added:.1f} us a task, "
        f"{100 * added / per_task:.2f} % of the median round's {per_task:.0f} us a task"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
