"""Task-cache benchmark (issue 15): a fully cached rerun vs the uncached run.

The 1,000-task pack of bench_dispatch.py (independent command tasks, each
writing an empty result through sh), at -j 2:

1. the run without --cache (the baseline);
2. the run with --cache DIR into an empty DIR (it records every unit: reported,
   not budgeted);
3. the same pack again into a new state dir with the same --cache DIR: every
   unit is a hit, keyed from the records and restored on the dispatcher's
   scheduling thread: no staging, no task process, and no worker process is
   even forked (the pool forks at the first unit that needs one; printed from
   the session's ``worker_max_rss_kib``, 0 when none ran). Budget: at most
   25 % of (1)'s wall time.

The 1-minute load average is printed before and after, and each run's CPU time
(user + sys of its process tree) beside its wall time: on a shared machine the
CPU ratio is the steadier figure, the wall ratio the budgeted one.

Every run writes into a fresh directory, and the rounds start once creating an
inode costs what it does on a quiet filesystem (bench_dispatch.settle: on ext4
without a journal, inodes freed in the last minutes make new ones slow, and the
uncached run, which creates more of them, would pay more of that than the
cached one: a ratio that flatters the cache). Nothing is deleted until the end.

Run: python benchmarks/bench_cache.py [--tasks N] [--repeat R] [--settle SECONDS]
Exits 1 if the budget is exceeded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dispatch import DISPATCH, SETTLED_US, settle, write_pack

BUDGET = 0.25


def _timed(argv: list[str], cpu: list[float]) -> float:
    """Wall time of one run; its CPU time (user + sys of its process tree) is
    appended to ``cpu``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


def _worker_rss(state: Path) -> int:
    """``worker_max_rss_kib`` of the session's run_finished (0: no worker ran)."""
    for line in (state / "session.jsonl").read_bytes().splitlines():
        event = json.loads(line)
        if event["event"] == "run_finished":
            return int(event["worker_max_rss_kib"])
    return -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--settle",
        type=float,
        default=420.0,
        help="wait up to this many seconds for the filesystem to settle (0: do not wait)",
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    try:
        cost = settle(root, args.settle)
        hint = "  (inflated: many files were deleted here lately)" if cost > SETTLED_US else ""
        print(f"# inode creation on this filesystem now: {cost:.1f} us per inode{hint}")
        plan = write_pack(root, args.tasks)
        base = [DISPATCH, str(plan), "-j", "2"]
        uncached: list[float] = []
        recording: list[float] = []
        cached: list[float] = []
        cpu: dict[str, list[float]] = {"plain": [], "rec": [], "hit": []}
        load = os.getloadavg()[0]
        for r in range(args.repeat):
            cache = root / f"cache{r}"
            uncached.append(_timed([*base, "--state", str(root / f"plain{r}")], cpu["plain"]))
            rec = [*base, "--state", str(root / f"rec{r}"), "--cache", str(cache)]
            recording.append(_timed(rec, cpu["rec"]))
            hit = [*base, "--state", str(root / f"hit{r}"), "--cache", str(cache)]
            cached.append(_timed(hit, cpu["hit"]))
        u, w, c = (statistics.median(x) for x in (uncached, recording, cached))
        cu, cw, cc = (statistics.median(cpu[k]) for k in ("plain", "rec", "hit"))
        ratio = c / u
        print(f"tasks: {args.tasks}, -j 2, median of {args.repeat}")
        print(f"load average (1 min): {load:.2f} before, {os.getloadavg()[0]:.2f} after")
        print(f"uncached run:          {u:8.3f} s  (cpu {cu:.3f} s)")
        print(
            f"recording run (--cache, empty): {w:8.3f} s  ({w / u:.2f}x uncached; cpu {cw:.3f} s)"
        )
        print(f"fully cached rerun:    {c:8.3f} s  (cpu {cc:.3f} s, {cc / cu:.1%} of uncached)")
        print(f"cached / uncached:     {ratio:8.1%}  (budget {BUDGET:.0%}, wall time)")
        n = args.tasks
        print(
            f"cpu ms per task:       uncached {cu / n * 1e3:.3f}, recording {cw / n * 1e3:.3f}, "
            f"cached {cc / n * 1e3:.3f}"
        )
        rss = [_worker_rss(root / f"hit{r}") for r in range(args.repeat)]
        print(f"fully cached rerun's workers: {'none forked' if not any(rss) else rss}")
        return 0 if ratio <= BUDGET else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
