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

With ``--instances N`` (issue 14: ``--instances 100000``) it runs instead one
no-op fan-out of N instances (``map = "items.items"``), on the disk and on a
tmpfs (one mounted for the run where that is allowed, else ``/dev/shm``), and
prints for each the wall time, the dispatcher's peak RSS and what the run left
in its state directory: inodes and bytes allocated (``os.walk`` + ``lstat``,
``st_blocks * 512``; a hard link counted once), per instance and by top-level
entry (``work``, ``results``, ``output``, ...). Budget: at most 4 inodes and
4 KiB per no-op instance (``--budget`` to exit 1 when over).

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
from pathlib import Path

from _tmpfs import tmpfs_dir

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")
RSS_BUDGET_MIB = 300.0
#: per no-op instance, what a run may leave in its state (issue 14)
INODES_PER_INSTANCE = 4.0
BYTES_PER_INSTANCE = 4096.0


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
    t = time.perf_counter()
    subprocess.run(
        # the map's source field holds every item: 100,000 of them are ~590 KB,
        # over the default 64 KiB cap on a declared field
        [DISPATCH, str(pack), "--state", str(state), "-j", "2", "--emit-cap", str(1 << 24)],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t
    rss = 0.0
    for line in state.joinpath("session.jsonl").read_bytes().splitlines():
        event = json.loads(line)
        if event["event"] == "run_finished":
            assert event["counts"]["passed"] == units, event
            rss = event["max_rss_kib"] / 1024
    return wall, rss


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


def no_op_fanout(root: Path, n: int, where: str) -> bool:
    """One no-op fan-out of n instances under root; prints its figures and
    returns whether they are within the per-instance budget."""
    wall, rss = run(map_pack(root, n), root / "state", n + 1)
    usage = state_usage(root / "state")
    inodes = sum(u[0] for u in usage.values())
    nbytes = sum(u[1] for u in usage.values())
    print(
        f"{where}: {n} no-op instances in {wall:.2f} s ({wall / n * 1e3:.3f} ms each), "
        f"dispatcher peak RSS {rss:.1f} MiB"
    )
    print(
        f"  state: {inodes} inodes, {nbytes / 1e6:.1f} MB; per instance "
        f"{inodes / n:.2f} inodes, {nbytes / n / 1024:.2f} KiB"
    )
    for top, (i, b) in usage.items():
        print(f"    {top:<14} {i:>9} inodes {i / n:6.2f}/instance {b / n / 1024:8.2f} KiB/instance")
    return inodes / n <= INODES_PER_INSTANCE and nbytes / n <= BYTES_PER_INSTANCE


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


def instances_main(n: int, budget: bool) -> int:
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        ok &= no_op_fanout(Path(tmp), n, f"disk ({Path(tmp).parent})")
    with tmpfs_dir("bench-fanout-") as (tmp, where):
        ok &= no_op_fanout(tmp, n, where)
    verdict = "within" if ok else "OVER"
    print(
        f"state budget {INODES_PER_INSTANCE:.0f} inodes and {BYTES_PER_INSTANCE / 1024:.0f} KiB "
        f"per instance: {verdict}"
    )
    return 0 if ok or not budget else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=100, help="axis length (N x N combinations)")
    ap.add_argument(
        "--instances", type=int, help="instead: one no-op fan-out of N instances, and its state"
    )
    ap.add_argument(
        "--budget", action="store_true", help="with --instances: exit 1 over the state budget"
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
        if args.instances < 1:
            ap.error("--instances must be at least 1")
        return instances_main(args.instances, args.budget)
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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
