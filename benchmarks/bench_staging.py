"""Benchmark staging captured files into a fan-out against one copy of them.

A producer captures one file of ``--size`` bytes (default 1 GiB); a map of
``--instances`` (default 100) instances needs it. Staging every instance's
``inputs/`` (the published copy built once, checked against the capture's
digest, then a reflink or hard link per instance) is timed against one plain
copy of the file on the same filesystem (``shutil.copyfile``, in-kernel).
Budget: what the file adds to staging (the same fan-out staged over a producer
without files is measured in the same run and subtracted) is at most 2x one
copy; the total is printed too (at 1 GiB the fan-out's own staging is a small
part of it). The old way, a copy per instance, is reported from the same run
(timed over one instance, scaled).

    python benchmarks/bench_staging.py [--size BYTES] [--instances N] [--dir DIR]

``--dir`` puts the state there (e.g. on XFS or btrfs to see reflinks). Prints
one line per figure; exits 1 if the budget is exceeded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.stage import StateDir, guard_views

BUDGET = 2.0


def _plan(instances: int) -> dict[str, Any]:
    tasks = _pair("p", ["big"]) + _pair("q", [])
    plan = {"version": 2, "edition": 3, "workflow": {"name": "b", "params": {}}, "tasks": tasks}
    return canon.loads(canon.dumps(plan))  # type: ignore[no-any-return]


def _pair(producer: str, emits_files: list[str]) -> list[dict[str, Any]]:
    """A producer and a map over it (``m`` over ``p``, ``n`` over ``q``)."""
    return [
        {
            "name": producer,
            "kind": "command",
            "run": ["true"],
            "needs": [],
            "join": "all",
            "emits": {"xs": "array"},
            "emits_files": emits_files,
            "retries": 0,
            "epilogue": False,
        },
        {
            "name": {"p": "m", "q": "n"}[producer],
            "kind": "command",
            "run": ["true"],
            "needs": [producer],
            "join": "all",
            "emits": {},
            "emits_files": [],
            "retries": 0,
            "epilogue": False,
            "map": f"{producer}.xs",
        },
    ]


def _write(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1 << 30, help="bytes of the captured file")
    ap.add_argument("--instances", type=int, default=100, help="instances of the map")
    ap.add_argument("--dir", default=None, help="where the state goes [default: a temp dir]")
    args = ap.parse_args(argv)
    if args.size < 1 or args.instances < 1:
        print("bench_staging: --size and --instances must be at least 1", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="bench-staging-", dir=args.dir))
    try:
        state = root / "state"
        state.mkdir()
        sd = StateDir(_plan(args.instances), state)  # a run builds its view once
        for producer in ("p", "q"):
            ws = state / "work" / producer
            ws.mkdir(parents=True)
            if producer == "p":
                _write(ws / "big", args.size)
            (ws / "out.json").write_bytes(canon.dumps({"xs": list(range(args.instances))}))
            rec = sd.capture(producer, ws, output_file=ws / "out.json", exit_code=0)
            assert rec["status"] == "passed", rec["note"]
        store = state / "files" / "p" / "big"

        # Each timed step starts with no dirty pages, so none pays for another's
        # writeback (the machine's dirty limit throttles whoever crosses it).
        os.sync()
        start = time.perf_counter()
        shutil.copyfile(store, root / "one-copy")
        one_copy = time.perf_counter() - start
        (root / "one-copy").unlink()

        os.sync()
        start = time.perf_counter()
        for k in range(args.instances):
            sd.stage_inputs("n", state / "work" / "n" / str(k), key=str(k))
        no_files = time.perf_counter() - start

        os.sync()
        start = time.perf_counter()
        for k in range(args.instances):
            sd.stage_inputs("m", state / "work" / "m" / str(k), key=str(k))
        staging = time.perf_counter() - start
        staged = state / "work" / "m" / "0" / "inputs" / "p" / "big"
        how = "hard links" if staged.stat().st_nlink > 1 else "reflinks or copies"

        # Dispatch's way (one copy, inputs.md 3.4): this process guards the
        # views, so they link the stored inode itself under a read lease, each
        # given up at the consumer's check (timed too: dispatch pays it).
        guard_views()
        os.sync()
        start = time.perf_counter()
        for k in range(args.instances):
            ws = state / "work" / "g" / str(k)
            sd.stage_inputs("m", ws, key=str(k))
            sd.check_inputs("m", ws, key=str(k))
        guarded = time.perf_counter() - start
        leased = state / "work" / "g" / "0" / "inputs" / "p" / "big"
        one = leased.stat().st_ino == store.stat().st_ino

        os.sync()
        start = time.perf_counter()
        shutil.copyfile(store, root / "old-way")
        old_way = (time.perf_counter() - start) * args.instances
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = (staging - no_files) / one_copy
    print(f"one copy of {args.size} bytes: {one_copy * 1e3:.0f} ms")
    print(
        f"staging {args.instances} instances without files: {no_files * 1e3:.0f} ms; "
        f"with the file ({how}): {staging * 1e3:.0f} ms = {staging / one_copy:.2f}x one copy"
    )
    print(f"what the file adds: {ratio:.2f}x one copy (budget {BUDGET}x)")
    guarded_ratio = (guarded - no_files) / one_copy
    print(
        f"guarded views of the one stored copy (dispatch's way; "
        f"{'links to the stored inode' if one else 'reflinks or copies'}), staged and "
        f"checked: {guarded * 1e3:.0f} ms; what the file adds: {guarded_ratio:.2f}x one copy "
        f"(budget {BUDGET}x)"
    )
    print(
        f"a copy per instance (before): about {old_way * 1e3:.0f} ms "
        f"= {old_way / one_copy:.1f}x one copy"
    )
    return 0 if ratio <= BUDGET and guarded_ratio <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
