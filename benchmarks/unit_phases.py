"""Where a dispatched unit's time goes, phase by phase (issue 33; no budget).

bench_dispatch says how far crucible is from make and from the floor
(floor_engine.py); this says where the difference is spent, so that work on
the per-unit path is judged phase by phase. On bench_dispatch's workload
(N independent ``sh`` tasks at -j 2, in a fresh directory) it runs
crucible-dispatch three times, each in a child interpreter that wraps a few of
crucible's own functions with clocks before it starts the command:

1. from the plan: the start-up (milliseconds from the interpreter's first
   line of this script to admission, the plan's load, the session's opening,
   the workers' fork and the first reply), and each worker's CPU per unit in
   each phase of ``UnitRunner`` (begin, start, wait, ended, finish; the rest
   of the worker's CPU is its loop, pickles and pipes);
2. a recording run with ``--cache`` (not measured);
3. a fully cached rerun: the wall time per hit of each step of a lookup
   (key, ledger find, restore) and of its settling (events included).

The wrappers cost a clock read or two per call (about 1 us against a unit's
~500 us of worker CPU). The function names they wrap are crucible's internals:
tests/run/test_unit_phases.py runs this script, so a rename breaks a test, not
a measurement nobody runs.

Run: python benchmarks/unit_phases.py [--tasks N] [--dir DIR] [--json]
"""

from __future__ import annotations

import time

#: the child's clock starts here, before anything else is imported: what
#: crucible's own start-up imports is not loaded ahead of it (the interpreter's
#: own start, ~10 ms here, comes before and is not counted)
_BEGAN = time.perf_counter()

import json  # noqa: E402  (crucible loads it too)
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402  (crucible loads it too)
from typing import Any  # noqa: E402

#: (module, class or None, function, what the report calls it)
_STARTUP = (
    ("crucible.run.session._admit", None, "admit", "admission"),
    ("crucible.run.session._admit", None, "_load", "plan load"),
    ("crucible.run.session._session", "Session", "__enter__", "session open"),
    ("crucible.run.executors._workers", "WorkerPool", "start", "workers forked"),
    ("crucible.run.executors._workers", "WorkerPool", "read", "first reply"),
)
_WORKER = ("begin", "start", "wait", "ended", "finish")
_HITS = (
    ("crucible.run.cache._unit", "UnitCache", "key", "key"),
    ("crucible.run.cache._unit", "UnitCache", "find", "ledger find"),
    ("crucible.run.cache._unit", "UnitCache", "restore_reply", "restore"),
    ("crucible.run.engine._attempts", "Attempts", "settle_cached", "settle"),
)


def _owner(module: str, cls: str | None) -> Any:
    __import__(module)
    found = sys.modules[module]
    return getattr(found, cls) if cls else found


Clocks = tuple[Callable[[], None], Callable[[], None]]


def _summed(into: dict[str, list[int]], label: str, clock: Callable[[], int]) -> Clocks:
    """(before, after) adding each call's ``clock`` time and a count to ``into[label]``."""
    started: list[int] = []

    def before() -> None:
        started.append(clock())

    def after() -> None:
        total = into.setdefault(label, [0, 0])
        total[0] += clock() - started.pop()
        total[1] += 1

    return before, after


def _wrap(owner: Any, name: str, before: Callable[[], None], after: Callable[[], None]) -> None:
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        before()
        try:
            return inner(*args, **kwargs)
        finally:
            after()

    setattr(owner, name, timed)


def child(out: str, argv: list[str]) -> None:
    """Run ``crucible-dispatch argv`` here, clocked; what was measured goes to
    ``out`` (the dispatcher's) and ``out.<pid>`` (each worker's)."""
    sys.argv = ["crucible-dispatch", *argv]
    from crucible.run.cli import main
    from crucible.run.executors import _unit, _workers

    me = os.getpid()
    firsts: dict[str, float] = {}
    hits: dict[str, list[int]] = {}
    phases: dict[str, list[int]] = {}

    def first(label: str) -> Callable[[], None]:
        def note() -> None:
            firsts.setdefault(label, time.perf_counter())

        return note

    for module, cls, name, label in _STARTUP:
        _wrap(_owner(module, cls), name, lambda: None, first(label))
    for module, cls, name, label in _HITS:
        _wrap(_owner(module, cls), name, *_summed(hits, label, time.perf_counter_ns))
    for name in _WORKER:
        _wrap(_unit.UnitRunner, name, *_summed(phases, name, time.thread_time_ns))
    # every module named above is one a run loads anyway, before its first unit
    firsts["crucible imported"] = time.perf_counter()

    serve = _workers._serve

    def worker_serve(*args: Any, **kwargs: Any) -> None:
        phases.clear()  # what the dispatcher clocked before the fork is not the worker's
        cpu = time.thread_time_ns()
        try:
            serve(*args, **kwargs)
        finally:
            report = {"cpu_ns": time.thread_time_ns() - cpu, "phases": phases}
            Path(f"{out}.{os.getpid()}").write_text(json.dumps(report))

    _workers._serve = worker_serve
    real_exit = os._exit

    def leave(code: int) -> None:  # the dispatcher ends by os._exit (core.cli's fast_exit)
        if os.getpid() == me:
            firsts["exit"] = time.perf_counter()
            since = {k: (v - _BEGAN) * 1e3 for k, v in sorted(firsts.items(), key=lambda i: i[1])}
            Path(out).write_text(json.dumps({"ms": since, "hits": hits, "code": code}))
        real_exit(code)

    os._exit = leave  # type: ignore[assignment]
    main()


def _run_child(root: Path, label: str, argv: list[str]) -> dict[str, Any]:
    import subprocess

    out = root / f"{label}.json"
    subprocess.run(
        [sys.executable, __file__, "--child", str(out), "--", *argv],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    report: dict[str, Any] = json.loads(out.read_text())
    report["workers"] = [json.loads(p.read_text()) for p in sorted(root.glob(f"{label}.json.*"))]
    return report


def measure(root: Path, tasks: int) -> dict[str, Any]:
    """The three runs on a fresh workload under ``root``; the figures as a dict."""
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_dispatch import DISPATCH, write_pack

    root.mkdir(parents=True)
    plan = write_pack(root, tasks)
    pack = root / "pack.toml"
    cache = root / "cache"
    plain = _run_child(root, "plain", [str(plan), "--state", str(root / "s1"), "-j", "2"])
    subprocess.run(
        [DISPATCH, str(pack), "--state", str(root / "s2"), "-j", "2", "--cache", str(cache)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cached = _run_child(
        root, "cached", [str(pack), "--state", str(root / "s3"), "-j", "2", "--cache", str(cache)]
    )
    units = sum(w["phases"].get("begin", [0, 0])[1] for w in plain["workers"])
    phase_us = {
        name: sum(w["phases"].get(name, [0, 0])[0] for w in plain["workers"]) / max(units, 1) / 1e3
        for name in _WORKER
    }
    worker_us = sum(w["cpu_ns"] for w in plain["workers"]) / max(units, 1) / 1e3
    hit_us = {k: ns / max(n, 1) / 1e3 for k, (ns, n) in cached["hits"].items()}
    return {
        "tasks": tasks,
        "units": units,
        "startup_ms": plain["ms"],
        "worker_cpu_us": worker_us,
        "phase_cpu_us": phase_us,
        "hits": {k: n for k, (_, n) in cached["hits"].items()},
        "hit_us": hit_us,
        "cached_startup_ms": cached["ms"],
    }


def render(figures: dict[str, Any]) -> str:
    lines = [f"# {figures['tasks']} sh tasks at -j 2 (bench_dispatch's workload)"]
    lines.append("start-up of a run from the plan (ms since the interpreter started this script):")
    for label, ms in figures["startup_ms"].items():
        lines.append(f"  {label:<16} {ms:8.1f}")
    lines.append(
        f"a worker's CPU per unit ({figures['units']} units): {figures['worker_cpu_us']:.0f} us"
    )
    phases = figures["phase_cpu_us"]
    for name, us in phases.items():
        lines.append(f"  {name:<16} {us:8.1f} us")
    rest = figures["worker_cpu_us"] - sum(phases.values())
    lines.append(f"  {'loop and pipes':<16} {rest:8.1f} us")
    lines.append("a fully cached rerun, wall time per hit:")
    for label, us in figures["hit_us"].items():
        lines.append(f"  {label:<16} {us:8.1f} us  ({figures['hits'][label]} calls)")
    first = figures["cached_startup_ms"].get("admission")
    if first is not None:
        lines.append(f"  (its start-up to admission: {first:.1f} ms)")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "--child" and sys.argv[3] == "--":
        child(sys.argv[2], sys.argv[4:])
        return 0
    import argparse
    import shutil
    import subprocess
    import tempfile

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--dir", type=Path, help="where to work (default: a temp dir, removed after)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if args.tasks < 1:
        ap.error("--tasks: at least 1")
    base = args.dir or Path(tempfile.mkdtemp(prefix="unit-phases-"))
    root = base / f"run-{os.getpid()}"
    try:
        figures = measure(root, args.tasks)
    except OSError as exc:  # --dir not a directory, not writable, a full disk
        print(f"unit_phases: {exc.filename or root}: {exc.strerror}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:  # what the run said went to /dev/null
        print(f"unit_phases: {exc.cmd[0]} exited {exc.returncode} in {root}", file=sys.stderr)
        return 1
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(figures, indent=1) if args.json else render(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
