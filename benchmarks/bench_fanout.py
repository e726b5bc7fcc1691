"""Edition-4 fan-outs at scale: a matrix of N x N combinations against the plain
map of the same width, both run by ``crucible-dispatch`` in this process's session.

Prints, for the matrix and its baseline (``map = "items.items"`` over N*N items):
the dispatcher's peak RSS (``run_finished.max_rss_kib``, budget 300 MiB at 10,000
instances, as for the existing fan-out; bench_dispatch.py) and the wall-clock
ratio matrix / map. Also the time to expand the combinations in-process
(``crucible.run.engine._matrix.combinations``) against building the same number of dicts
with ``itertools.product`` (the floor of any expansion).

    python benchmarks/bench_fanout.py            # 100 x 100 = 10,000 instances
    python benchmarks/bench_fanout.py --side 20  # a quick run

With ``--instances N [N ...]`` (issue 33: ``--instances 10000 100000 1000000``)
it runs instead, for each N (a 10x ladder), one no-op fan-out of N instances
(``map = "items.items"``), on the disk and on a tmpfs (one mounted for the run
where that is allowed, else ``/dev/shm``), each in a fresh directory, and
prints per step: the wall time per instance, the dispatcher's peak RSS, what
the run left in its state directory (inodes and bytes allocated, ``os.walk`` +
``lstat``, ``st_blocks * 512``, a hard link counted once; per instance and by
top-level entry), then ``report``, ``report --html`` (time, peak RSS of the
report process, page size) and ``-n`` on the finished state. Budgets (issue
33), checked with ``--budget`` (exit 1 when over): time per instance flat
(the largest step's at most 1.2x the smallest's), the dispatcher's peak RSS
at most 512 MiB and growing less than the instances, at most 1 KiB of state
and 4 inodes an instance, ``report`` at most 30 s at 10^6 (pro rata below,
never under 2 s) and its peak RSS at most 512 MiB, the page at
most 2 MiB at any size, ``-n`` at most 30 s at 10^6 (pro rata). Run without
arguments (``nox -s bench``), it runs the matrix comparison and then the
ladder 10,000 and 100,000 with its budgets.

With ``--unlink-cycles N`` it times instead, in fresh directories on the disk,
N creations of a small file (a no-op's ``CRUCIBLE_OUTPUT``) against N cycles
that each create one and unlink the one created two cycles before (what
removing a passed attempt's output file after its capture does at ``-j 2``),
and prints the ratio: whether interleaved unlinks slow inode creation the way
a mass deletion does on this journal-less ext4 (docs/spec/run.md, "State
directory").
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _tmpfs import tmpfs_dir

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")
RSS_BUDGET_MIB = 300.0
#: per no-op instance, what a run may leave in its state (issue 14; issue 33: 1 KiB)
INODES_PER_INSTANCE = 4.0
BYTES_PER_INSTANCE = 1024.0
#: issue 33, the million-unit ladder's budgets
FLAT_RATIO = 1.2  # time per instance, largest step over smallest
DISPATCHER_RSS_MIB = 512.0  # at 10^6 (and below)
REPORT_S_AT_MILLION = 30.0  # report, report --html, -n at 10^6; pro rata below
REPORT_S_FLOOR = 2.0  # ... never under this (start-up)
REPORT_RSS_MIB = 512.0  # report's peak RSS at 10^6 (~300 B a folded instance: it streams)
PAGE_MIB = 2.0  # report --html at any size
#: the ladder nox -s bench runs (10^6 is run by hand: ~1 h on a 2-core machine)
DEFAULT_LADDER = (10_000, 100_000)


def matrix_pack(root: Path, side: int) -> Path:
    pack = root / "matrix.toml"
    pack.write_text(
        'edition = 4\n[workflow]\nname = "mx"\n[[workflow.task]]\nname = "each"\n'
        f"matrix = {{ a = {{ count = {side} }}, b = {{ count = {side} }} }}\n"
        'run = \'printf "{}" > "$CRUCIBLE_OUTPUT"\'\n'
    )
    return pack


def map_pack(root: Path, n: int) -> Path:
    pack = root / "map.toml"
    pack.write_text(
        'edition = 3\n[workflow]\nname = "fan"\n'
        '[[workflow.task]]\nname = "items"\nemits = { items = "array" }\n'
        f"run = '''printf '{{\"items\": [' > \"$CRUCIBLE_OUTPUT\"; seq -s, 1 {n} >> \"$CRUCIBLE_OUTPUT\"; printf ']}}' >> \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["items"]\nmap = "items.items"\n'
        'run = \'printf "{}" > "$CRUCIBLE_OUTPUT"\'\n'
    )
    return pack


def run(pack: Path, state: Path, units: int) -> tuple[float, float]:
    """(wall seconds, dispatcher peak RSS MiB)."""
    # the map's source field holds every item: 100,000 of them are ~590 KB,
    # over the default 64 KiB cap on a declared field
    argv = [DISPATCH, str(pack), "--state", str(state), "-j", "2", "--emit-cap", str(1 << 24)]
    t = time.perf_counter()
    code, _ = lean_run(argv)
    wall = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {code}")
    rss = 0.0
    # line by line, and only the run_finished line parsed: a 10^6-instance log
    # is ~0.5 GB, and this process's size would otherwise be what its next
    # children report as their own peak (lean_run)
    with state.joinpath("session.jsonl").open("rb") as log:
        for line in log:
            if b'"run_finished"' not in line:
                continue
            event = json.loads(line)
            if event["event"] == "run_finished":
                assert event["counts"]["passed"] == units, event
                rss = event["max_rss_kib"] / 1024
    return wall, rss


#: runs argv[2:] in a fork of a small interpreter and writes its wait4
#: ru_maxrss to the descriptor argv[1]
_LEAN = (
    "import os, sys\n"
    "fd = int(sys.argv[1])\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.set_inheritable(fd, False)\n"
    "    os.execv(sys.argv[2], sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "os.write(fd, b'%d' % usage.ru_maxrss)\n"
    "sys.exit(os.waitstatus_to_exitcode(status) & 255)\n"
)


def lean_run(argv: list[str], stdout: int | None = None) -> tuple[int, float]:
    """(exit code, peak RSS KiB) of ``argv``, started from a small interpreter.

    Why not straight from here: Linux reports, as a process's peak RSS, at
    least the peak of the memory it had before its exec, and a child forked
    (or vforked) from this process had this process's. After a 10^6-instance
    step this process held ~1 GiB, and every later command "peaked" at that
    (issue 33: the tmpfs dispatcher's 1,070 MiB was this benchmark's size).
    The interpreter in between is small when it forks the command."""
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LEAN, str(write_end), *argv],
            stdout=subprocess.DEVNULL if stdout is None else stdout,
            stderr=subprocess.DEVNULL,
            pass_fds=(write_end,),
        )
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as peak:
        kib = peak.read()
    code = proc.wait()
    return code, float(kib or 0)


def expansion(side: int) -> tuple[float, float]:
    from crucible.run.engine._matrix import combinations

    axes = [("a", list(range(side))), ("b", list(range(side)))]
    t = time.perf_counter()
    combos = combinations(axes)
    ours = time.perf_counter() - t
    t = time.perf_counter()
    floor = [{"a": a, "b": b} for a, b in itertools.product(range(side), range(side))]
    base = time.perf_counter() - t
    assert len(combos) == len(floor)
    return ours, base


def state_usage(state: Path) -> dict[str, tuple[int, int]]:
    """(inodes, bytes allocated) under ``state`` by top-level entry; the state
    directory itself counts under ".". A hard-linked inode is counted once."""
    seen: set[tuple[int, int]] = set()
    usage: dict[str, list[int]] = {}

    def add(top: str, path: str) -> None:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) in seen:
            return
        seen.add((st.st_dev, st.st_ino))
        u = usage.setdefault(top, [0, 0])
        u[0] += 1
        u[1] += st.st_blocks * 512

    add(".", str(state))
    for entry in os.scandir(state):
        add(entry.name, entry.path)
        if entry.is_dir(follow_symlinks=False):
            for root, dirs, files in os.walk(entry.path):
                for name in dirs + files:
                    add(entry.name, os.path.join(root, name))
    return {k: (v[0], v[1]) for k, v in sorted(usage.items())}


def timed(argv: list[str], out: Path | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one command (lean_run), stdout into
    ``out`` (discarded without one)."""
    sink = open(out, "wb") if out is not None else None  # noqa: SIM115
    try:
        t = time.perf_counter()
        code, kib = lean_run(argv, None if sink is None else sink.fileno())
        wall = time.perf_counter() - t
    finally:
        if sink is not None:
            sink.close()
    if code not in (0, 1):
        raise SystemExit(f"{' '.join(argv)}: exit {code}")
    return wall, kib / 1024


@dataclass
class Step:
    """One rung of the ladder: a no-op fan-out of ``n`` instances on ``where``."""

    n: int
    where: str
    wall: float = 0.0
    rss: float = 0.0
    inodes: int = 0
    nbytes: int = 0
    report_s: float = 0.0
    report_rss: float = 0.0
    html_s: float = 0.0
    html_rss: float = 0.0
    page: int = 0
    dry_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def per_instance_ms(self) -> float:
        return self.wall / self.n * 1e3


def report_budget_s(n: int) -> float:
    """``report``'s (and ``-n``'s) budget at ``n`` instances: 30 s at 10^6, pro rata."""
    return max(REPORT_S_AT_MILLION * n / 1e6, REPORT_S_FLOOR)


def no_op_fanout(root: Path, n: int, where: str) -> Step:
    """One no-op fan-out of n instances under root, then its report, page and
    dry run; prints its figures and returns them (with what is over budget)."""
    step = Step(n, where)
    state = root / "state"
    step.wall, step.rss = run(map_pack(root, n), state, n + 1)
    usage = state_usage(state)
    step.inodes = sum(u[0] for u in usage.values())
    step.nbytes = sum(u[1] for u in usage.values())
    print(
        f"{where}: {n} no-op instances in {step.wall:.2f} s ({step.per_instance_ms:.3f} ms each), "
        f"dispatcher peak RSS {step.rss:.1f} MiB"
    )
    print(
        f"  state: {step.inodes} inodes, {step.nbytes / 1e6:.1f} MB; per instance "
        f"{step.inodes / n:.2f} inodes, {step.nbytes / n:.0f} B"
    )
    for top, (i, b) in usage.items():
        print(f"    {top:<14} {i:>9} inodes {i / n:6.2f}/instance {b / n:8.0f} B/instance")
    step.report_s, step.report_rss = timed([DISPATCH, "report", str(state)])
    page = root / "page.html"
    step.html_s, step.html_rss = timed([DISPATCH, "report", str(state), "--html", str(page)])
    step.page = page.stat().st_size
    step.dry_s, _ = timed(
        [DISPATCH, str(root / "map.toml"), "--state", str(state), "-n", "--resume"]
    )
    print(
        f"  report {step.report_s:.2f} s (peak RSS {step.report_rss:.0f} MiB); "
        f"--html {step.html_s:.2f} s (peak RSS {step.html_rss:.0f} MiB), page "
        f"{step.page / 1024:.0f} KiB; -n {step.dry_s:.2f} s"
    )
    budget_s = report_budget_s(n)
    checks = (
        (step.inodes / n <= INODES_PER_INSTANCE, f"{step.inodes / n:.2f} inodes an instance"),
        (step.nbytes / n <= BYTES_PER_INSTANCE, f"{step.nbytes / n:.0f} B of state an instance"),
        (step.rss <= DISPATCHER_RSS_MIB, f"dispatcher peak RSS {step.rss:.0f} MiB"),
        (step.report_s <= budget_s, f"report {step.report_s:.1f} s > {budget_s:.1f} s"),
        (step.html_s <= budget_s, f"report --html {step.html_s:.1f} s > {budget_s:.1f} s"),
        (step.dry_s <= budget_s, f"-n {step.dry_s:.1f} s > {budget_s:.1f} s"),
        (step.report_rss <= REPORT_RSS_MIB, f"report peak RSS {step.report_rss:.0f} MiB"),
        (step.html_rss <= REPORT_RSS_MIB, f"report --html peak RSS {step.html_rss:.0f} MiB"),
        (step.page <= PAGE_MIB * 2**20, f"page {step.page / 2**20:.2f} MiB"),
    )
    step.problems = [what for ok, what in checks if not ok]
    return step


def ladder_verdict(steps: list[Step]) -> list[str]:
    """What is over budget across the steps of one filesystem: time per
    instance not flat, RSS growing as fast as the instances."""
    problems = [f"{s.n} on {s.where}: {p}" for s in steps for p in s.problems]
    if len(steps) >= 2:
        lo, hi = steps[0], steps[-1]
        ratio = hi.per_instance_ms / lo.per_instance_ms
        print(
            f"  {lo.where}: time per instance {lo.n} -> {hi.n}: {lo.per_instance_ms:.3f} -> "
            f"{hi.per_instance_ms:.3f} ms, ratio {ratio:.2f} (budget {FLAT_RATIO})"
        )
        if ratio > FLAT_RATIO:
            problems.append(f"{lo.where}: time per instance x{ratio:.2f} from {lo.n} to {hi.n}")
        growth = hi.rss / lo.rss if lo.rss else 0.0
        print(
            f"  {lo.where}: dispatcher peak RSS {lo.rss:.0f} -> {hi.rss:.0f} MiB "
            f"(x{growth:.1f} for x{hi.n / lo.n:.0f} instances)"
        )
        if growth >= hi.n / lo.n:
            problems.append(f"{lo.where}: dispatcher RSS grows as fast as the instances")
    return problems


def _create(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, b"{}")
    finally:
        os.close(fd)


def unlink_cycles(root: Path, n: int) -> tuple[float, float]:
    """(seconds for n creations, seconds for n create+unlink cycles), each in a
    fresh directory under ``root``; the created files are left for the caller's
    temporary directory to remove."""
    only, cycled = root / "create-only", root / "create-unlink"
    only.mkdir()
    cycled.mkdir()
    t = time.perf_counter()
    for i in range(n):
        _create(f"{only}/{i}.json")
    create_only = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        _create(f"{cycled}/{i}.json")
        if i >= 2:
            os.unlink(f"{cycled}/{i - 2}.json")
    create_unlink = time.perf_counter() - t
    return create_only, create_unlink


def unlink_main(n: int) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-unlink-") as tmp:
        only, cycled = unlink_cycles(Path(tmp), n)
    print(
        f"disk ({Path(tempfile.gettempdir())}): {n} creations {only * 1e3:.0f} ms "
        f"({only / n * 1e6:.1f} us each); {n} create+unlink cycles {cycled * 1e3:.0f} ms "
        f"({cycled / n * 1e6:.1f} us each); ratio create+unlink / create-only "
        f"{cycled / only:.2f}"
    )
    return 0


def instances_main(ladder: list[int], budget: bool, where: str = "both") -> int:
    disk: list[Step] = []
    tmpfs: list[Step] = []
    for n in ladder:  # each step in directories of its own, removed after it
        if where in ("both", "disk"):
            with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
                disk.append(no_op_fanout(Path(tmp), n, f"disk ({Path(tmp).parent})"))
        if where in ("both", "tmpfs"):
            with tmpfs_dir("bench-fanout-") as (tmp, place):
                tmpfs.append(no_op_fanout(tmp, n, place))
    print(
        "# N, where: ms/instance, dispatcher MiB, state B/instance, report s/MiB, html s/KiB, -n s"
    )
    for s in disk + tmpfs:
        print(
            f"  {s.n:>8} {s.where.split(' ')[0]:<6} {s.per_instance_ms:7.3f} {s.rss:7.0f} "
            f"{s.nbytes / s.n:6.0f} {s.report_s:7.2f}/{s.report_rss:<5.0f} "
            f"{s.html_s:7.2f}/{s.page / 1024:<6.0f} {s.dry_s:6.2f}"
        )
    problems = ladder_verdict(disk) + ladder_verdict(tmpfs)
    for p in problems:
        print(f"OVER BUDGET: {p}")
    print(f"ladder {', '.join(map(str, ladder))}: {'within budget' if not problems else 'OVER'}")
    return 0 if not problems or not budget else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=100, help="axis length (N x N combinations)")
    ap.add_argument(
        "--instances",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: a no-op fan-out of each N instances, its state, report and page",
    )
    ap.add_argument("--budget", action="store_true", help="with --instances: exit 1 over a budget")
    ap.add_argument(
        "--where",
        choices=("both", "disk", "tmpfs"),
        default="both",
        help="with --instances: the filesystems to run each step on (default: both)",
    )
    ap.add_argument(
        "--no-ladder",
        action="store_true",
        help="without --instances: the matrix comparison only (not the 10^4, 10^5 ladder)",
    )
    ap.add_argument(
        "--unlink-cycles",
        type=int,
        help="instead: N file creations against N create+unlink cycles, and their ratio",
    )
    args = ap.parse_args()
    if args.unlink_cycles is not None:
        if args.unlink_cycles < 3:
            ap.error("--unlink-cycles must be at least 3")
        return unlink_main(args.unlink_cycles)
    if args.instances is not None:
        if min(args.instances) < 1:
            ap.error("--instances must be at least 1")
        return instances_main(sorted(args.instances), args.budget, args.where)
    n = args.side * args.side
    ours, floor = expansion(args.side)
    print(
        f"expand {n} combinations: {ours * 1e3:.1f} ms, floor {floor * 1e3:.1f} ms, "
        f"ratio {ours / floor:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        root = Path(tmp)
        m_wall, m_rss = run(matrix_pack(root, args.side), root / "m-state", n)
        b_wall, b_rss = run(map_pack(root, n), root / "b-state", n + 1)
    print(f"matrix {n}: {m_wall:.2f} s, dispatcher peak RSS {m_rss:.1f} MiB")
    print(f"map    {n}: {b_wall:.2f} s, dispatcher peak RSS {b_rss:.1f} MiB")
    print(f"ratio matrix/map: wall {m_wall / b_wall:.2f}, RSS {m_rss / b_rss:.2f}")
    ok = m_rss <= RSS_BUDGET_MIB or n < 10000
    budget = "within" if m_rss <= RSS_BUDGET_MIB else "OVER"
    print(f"RSS budget {RSS_BUDGET_MIB:.0f} MiB: {budget}")
    if not args.no_ladder:
        ok &= instances_main(list(DEFAULT_LADDER), budget=True) == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
