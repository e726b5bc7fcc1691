"""Benchmark the ledger's on-disk index (steps.idx): open + one lookup at N records
against the same at one record, and the peak memory of doing it.

1. ``crucible-ledger get`` (a whole process: what a Makefile recipe pays) at N
   records vs at 1 record: wall time, median of interleaved runs (budget 2x).
2. The same in one process (``Ledger(dir)`` + ``lookup``, no interpreter start):
   median wall time, printed for reference (microseconds: too small for a budget
   on a shared machine).
3. Peak RSS of the ``get`` process at N records (budget 64 MiB).

The index is built by a first open (timed and printed: a rebuild costs a scan).
Run: python benchmarks/bench_ledger_index.py [--records N] [--runs K]. Exits 1
if over a budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_ledger import _step, write_ledger  # the script's directory is on sys.path

from crucible.ledger import Ledger

TIME_BUDGET = 2.0
RSS_BUDGET_KIB = 64 * 1024
LEDGER = str(Path(sys.executable).parent / "crucible-ledger")

IN_PROCESS = r"""
import sys, time
from crucible.ledger import Ledger
directory, step, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
times = []
for _ in range(runs):
    start = time.perf_counter()
    with Ledger(directory, readonly=True) as ledger:
        hit = ledger.lookup("make", step)
    times.append(time.perf_counter() - start)
    assert hit is not None
times.sort()
print(times[len(times) // 2])
"""


#: runs each command it is given (a JSON argv per line) and answers with its wall
#: time, peak RSS and exit code. Started before the bench allocates anything: a
#: child's peak RSS counts its parent's memory at the fork, so a child of the
#: bench itself (hundreds of MB after building a ledger) would report that.
SPAWNER = r"""
import json, os, subprocess, sys, time
for line in sys.stdin:
    argv = json.loads(line)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    print(wall, usage.ru_maxrss, os.waitstatus_to_exitcode(status), flush=True)
"""


class Spawner:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SPAWNER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, argv: list[str]) -> tuple[float, int]:
        """(wall seconds, peak RSS KiB) of one run of ``argv``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        wall, rss, code = self.proc.stdout.readline().split()
        if code != "0":
            raise SystemExit(f"{argv} failed ({code})")
        return float(wall), int(rss)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def get_argv(directory: Path, step: str) -> list[str]:
    return [LEDGER, "get", "--dir", str(directory), "--scope", "make", "--step", step]


def in_process(directory: Path, step: str, runs: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(directory), step, str(runs)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout)


def report(name: str, value: float, baseline: float, budget: float, unit: str) -> bool:
    ratio = value / baseline
    ok = ratio <= budget
    print(
        f"{'ok  ' if ok else 'OVER'} {name}: {value:.1f} {unit} vs {baseline:.1f} {unit}: "
        f"ratio {ratio:.2f} (budget {budget:.1f}x)"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    spawner = Spawner()
    with tempfile.TemporaryDirectory(prefix="bench-ledger-index-") as tmp:
        root = Path(tmp)
        big, one = root / "big", root / "one"
        big.mkdir()
        one.mkdir()
        start = time.perf_counter()
        write_ledger(big / "steps.jsonl", args.records)
        write_ledger(one / "steps.jsonl", 1)
        size = (big / "steps.jsonl").stat().st_size
        print(
            f"# ledger of {args.records:,} records ({size / 1e6:.0f} MB) written in "
            f"{time.perf_counter() - start:.1f} s"
        )
        for directory, count in ((big, args.records), (one, 1)):
            start = time.perf_counter()
            with Ledger(directory) as ledger:  # the first open builds steps.idx
                assert ledger.report.source == "rebuilt" and len(ledger) == count
            print(
                f"# index of {count:,} records built in {time.perf_counter() - start:.2f} s "
                f"({(directory / 'steps.idx').stat().st_size / 1e6:.1f} MB)"
            )
        # a step near the end of the big ledger, and the one step of the small one
        big_step, one_step = _step(args.records - 1), _step(0)
        walls: dict[str, list[float]] = {"big": [], "one": []}
        rss = 0
        for _ in range(args.runs):  # interleaved: load on the machine hits both alike
            wall, _ = spawner.run(get_argv(one, one_step))
            walls["one"].append(wall)
            wall, peak = spawner.run(get_argv(big, big_step))
            walls["big"].append(wall)
            rss = max(rss, peak)
        median = statistics.median
        ok = report(
            f"crucible-ledger get at {args.records:,} vs 1 record, median wall",
            median(walls["big"]) * 1e3,
            median(walls["one"]) * 1e3,
            TIME_BUDGET,
            "ms",
        )
        inner_big = in_process(big, big_step, 201)
        inner_one = in_process(one, one_step, 201)
        print(
            f"# in one process, open + one lookup: {inner_big * 1e6:.0f} us at "
            f"{args.records:,} records vs {inner_one * 1e6:.0f} us at 1 "
            f"(ratio {inner_big / inner_one:.2f}, reference)"
        )
        ok_rss = rss <= RSS_BUDGET_KIB
        print(
            f"{'ok  ' if ok_rss else 'OVER'} peak RSS of get at {args.records:,} records: "
            f"{rss / 1024:.1f} MiB (budget {RSS_BUDGET_KIB // 1024} MiB)"
        )
        ok &= ok_rss
    spawner.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
