"""Dispatcher benchmark (issues 4 and 14), ratios against baselines run side by side.

1. 1,000 independent command tasks at -j 2, each writing an empty result object
   through sh, vs `make -j2` running 1,000 recipes that write the same files
   through sh, and vs doit (if importable) on the same workload. crucible is
   timed twice a round: from the pack.toml, the way people run it (compile
   included), and from the compiled plan. Budgets (issue 33): each at most
   1.4x make, and faster than doit in every round. Then a fully cached rerun
   of the pack (``--cache``: every unit restored, no process started) against
   the uncached run from the pack: at most 10 % of its wall time. The same
   rounds are then run on a tmpfs (one mounted for the run where allowed, else
   /dev/shm) and reported without a budget; snakemake is timed once with
   --snakemake EXE.
   A chain of --chain of the same tasks (each needs the one before: a link
   starts once the record before it is durable) is timed against make on the
   disk, reported without a budget.
   Beside them, each round times benchmarks/floor_engine.py (info, no budget):
   the contract's file work per task in plain Python and nothing else, the
   floor a Python engine can reach on this workload; then crucible against
   that floor, and what the wall budget leaves it over the floor in those
   rounds (below 1: the budget is under the floor itself). Where crucible's
   share goes, phase by phase: benchmarks/unit_phases.py.
2. Peak RSS of the dispatcher running a 10,000-instance fan-out (budget 300 MiB),
   as reported by the dispatcher itself (run_finished.max_rss_kib = getrusage
   ru_maxrss of its own process); its staging workers' largest peak is printed
   beside it (forked, they share most of those pages).

Informational lines give the CPU time (user + sys of the whole process
tree) of each, steadier than wall time on a shared machine, and per task.

Every timed run writes into a directory of its own that no earlier run used,
and nothing is deleted until every run is done. Why: this machine's ext4 has no
journal, and without one the kernel will not reuse an inode freed less than 60 s
ago (300 s more while its inode-table block is dirty): ext4's recently_deleted(),
seen in a kernel profile. Each new inode then costs a scan over every recently
freed one, up to ~400 us instead of ~15 us. A dispatched task of this workload
creates 3 inodes (workspace, output, record; a log only when it prints; no
inputs/ tree, as it has nothing to stage: inputs.md 3.7) where a make recipe
creates one, so deleting one repetition's outputs right before the
next would measure the filesystem's penalty for the previous run, not either
tool. So the benchmark first waits (up to --settle seconds, 420 by default)
until creating inodes (directories and files, in several fresh directories)
costs what it does on a quiet filesystem, twice in a row, as one waits for a
machine to go quiet before timing it; the first line printed is that cost (us
per inode). Above ~30 us, something deleted many files in the last minutes and
every figure below is inflated by it.

Run: python benchmarks/bench_dispatch.py [--tasks N] [--fanout N (0: none)] [--repeat R]
     [--chain N (0: none)]
     [--settle SECONDS] [--snakemake EXE]
Exits 1 if a budget is exceeded.
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
from typing import Any

from _tmpfs import tmpfs_dir

BIN = Path(sys.executable).parent
DISPATCH = str(BIN / "crucible-dispatch")
#: issue 33: at most 1.4x make -j2 on the disk (from the pack and from the
#: plan), and faster than doit in every round
WALL_BUDGET = 1.4
#: issue 33: a fully cached rerun of the pack, against its uncached run
CACHED_BUDGET = 0.10
#: us per empty file created: above this, recently deleted inodes are being
#: skipped (see the module doc); a quiet ext4 here takes 15-30 us
SETTLED_US = 30.0
RSS_BUDGET_MIB = 300.0


def _task_toml(i: int) -> str:
    return f'[[workflow.task]]\nname = "t{i}"\nrun = \'printf "{{}}" > "$CRUCIBLE_OUTPUT"\'\n'


def write_pack(root: Path, n: int) -> Path:
    pack = root / "pack.toml"
    head = 'edition = 3\n\n[workflow]\nname = "bench"\n\n'
    pack.write_text(head + "\n".join(_task_toml(i) for i in range(n)))
    plan = root / "plan.json"
    out = subprocess.run(
        [str(BIN / "crucible-compile"), str(pack)], capture_output=True, check=False
    )
    if out.returncode == 0 and out.stdout:
        plan.write_bytes(out.stdout)
    else:  # compile's CLI not there: compile through the library
        from crucible.compile import compile_path

        plan.write_bytes(compile_path(pack).data)
    return plan


def _make_rule(i: int, prerequisite: str = "") -> str:
    """Recipe ``i``: writes ``$(OUT)/t<i>.json`` through sh, as task ``t<i>`` does."""
    return f'$(OUT)/t{i}.json: {prerequisite}\n\t@sh -c \'printf "{{}}" > "$$0"\' $@\n'


def write_makefile(root: Path, n: int) -> Path:
    """1,000 recipes writing ``$(OUT)/t<i>.json`` (OUT: a fresh directory per run)."""
    mk = root / "Makefile"
    targets = " ".join(f"$(OUT)/t{i}.json" for i in range(n))
    rules = "".join(_make_rule(i) for i in range(n))
    mk.write_text(f"all: {targets}\n{rules}")
    return mk


def write_chain(root: Path, n: int) -> Path:
    """The same recipes as a chain (each task needs the one before it), as a
    pack compiled to ``plan.json`` and a Makefile, in ``root``; returns the plan."""
    root.mkdir(parents=True, exist_ok=True)
    head = 'edition = 3\n\n[workflow]\nname = "chain"\n\n'
    tasks = "\n".join(_task_toml(i) + (f'needs = ["t{i - 1}"]\n' if i else "") for i in range(n))
    (root / "pack.toml").write_text(head + tasks)
    from crucible.compile import compile_path

    plan = root / "plan.json"
    plan.write_bytes(compile_path(root / "pack.toml").data)
    rules = "".join(_make_rule(i, f"$(OUT)/t{i - 1}.json" if i else "") for i in range(n))
    (root / "Makefile").write_text(f"all: $(OUT)/t{n - 1}.json\n{rules}")
    return plan


def chain_rounds(root: Path, n: int, repeat: int) -> None:
    """A chain of ``n`` tasks, make against crucible from the plan, interleaved:
    each link waits for the record before it to be durable (reported, no budget)."""
    plan = write_chain(root, n)
    make: list[float] = []
    ours: list[float] = []
    for _ in range(repeat):
        make.append(time_make(root))
        ours.append(time_dispatch(plan, root, "plan"))
    line(
        f"crucible-dispatch a {n}-task chain from the plan (wall, info)",
        statistics.median(ours),
        statistics.median(make),
        "s",
        None,
    )
    print(
        f"  per link (info): {statistics.median(ours) / n * 1e3:.2f} ms, "
        f"make {statistics.median(make) / n * 1e3:.2f} ms"
    )


def write_dodo(root: Path, n: int) -> Path:
    """The same 1,000 actions for doit, writing into ``$OUT`` (fresh per run)."""
    dodo = root / "dodo.py"
    dodo.write_text(
        "import os\n"
        "OUT = os.environ['OUT']\n"
        "def task_t():\n"
        f"    for i in range({n}):\n"
        "        target = f'{OUT}/t{i}.json'\n"
        "        yield {'name': str(i), 'actions': [f\"sh -c 'printf \\\"{{}}\\\" > {target}'\"],"
        " 'targets': [target], 'verbosity': 0}\n"
    )
    return dodo


def write_snakefile(root: Path, n: int) -> Path:
    """The same workload for snakemake, writing into ``config["out"]``."""
    snakefile = root / "Snakefile"
    snakefile.write_text(
        'OUT = config["out"]\n'
        f'rule all:\n    input: expand(OUT + "/t{{i}}.json", i=range({n}))\n'
        'rule t:\n    output: OUT + "/t{i}.json"\n    shell: "printf \'{{}}\' > {output}"\n'
    )
    return snakefile


def time_snakemake(root: Path, exe: str) -> float:
    """One run of snakemake -j 2 (it takes tens of seconds: not repeated)."""
    out = fresh(root, "out-snakemake")
    out.mkdir()
    t = time.perf_counter()
    subprocess.run(
        [
            exe,
            "-j",
            "2",
            "-s",
            str(root / "Snakefile"),
            "--directory",
            str(root),
            "--config",
            f"out={out}",
            "--quiet",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: CPU seconds (user + sys, the whole process tree) of each timed run, for the
#: informational CPU lines: steadier than wall time on a shared machine.
CPU: dict[str, list[float]] = {
    "pack": [],
    "plan": [],
    "make": [],
    "doit": [],
    "cached": [],
    "floor": [],
}


def fresh(root: Path, name: str) -> Path:
    """A path under ``root`` that no earlier run used (see the module doc)."""
    n = 0
    while (root / f"{name}-{n}").exists():
        n += 1
    return root / f"{name}-{n}"


def inode_cost_us(root: Path, n: int = 2000) -> float:
    """Wall time per inode created (kept until the end): half directories, half
    files, spread over 8 fresh directories. ext4 places each new directory in a
    block group of its own choosing and a file in its directory's group, and the
    penalty (module doc) lives in some groups and not others: one directory
    would sample one group."""
    per_dir = n // 16
    t = time.perf_counter()
    for _ in range(8):
        d = fresh(root, "calibrate")
        d.mkdir()
        for i in range(per_dir):
            sub = d / str(i)
            sub.mkdir()
            os.close(os.open(sub / "f", os.O_WRONLY | os.O_CREAT, 0o644))
    return (time.perf_counter() - t) / (8 + 16 * per_dir) * 1e6


def settle(root: Path, max_wait: float) -> float:
    """Wait (up to ``max_wait`` s) until creating an inode costs what it costs on
    a quiet filesystem, twice in a row, as one waits for a machine to go quiet
    before timing it: the no-journal ext4 penalty described in the module doc
    lasts 60-360 s after a mass deletion (such as the previous benchmark's
    cleanup) and charges each tool by the inodes it creates. Returns the last
    cost measured."""
    deadline = time.monotonic() + max_wait
    quiet = 0
    while True:
        cost = inode_cost_us(root)
        quiet = quiet + 1 if cost <= SETTLED_US else 0
        if quiet == 2 or time.monotonic() >= deadline:
            return cost
        if not quiet:
            print(
                f"# waiting for the filesystem to settle: {cost:.0f} us per new inode", flush=True
            )
        time.sleep(15 if not quiet else 1)


def _timed(kind: str, argv: list[str], **popen: Any) -> float:
    """Wall seconds of one run of ``argv`` (``check=True``); its CPU (user + sys
    of its process tree) goes under ``kind``."""
    cpu = _children_cpu()
    t = time.perf_counter()
    subprocess.run(argv, check=True, **popen)
    wall = time.perf_counter() - t
    CPU[kind].append(_children_cpu() - cpu)
    return wall


def time_dispatch(target: Path, root: Path, kind: str, *cache: str) -> float:
    """One run of crucible-dispatch on ``target`` (a pack.toml or a plan) into a
    fresh state; its CPU goes under ``kind``."""
    state = fresh(root, "state")
    argv = [DISPATCH, str(target), "--state", str(state), "-j", "2", *cache]
    return _timed(kind, argv, stderr=subprocess.DEVNULL)


def time_make(root: Path) -> float:
    out = fresh(root, "out")
    out.mkdir()
    argv = ["make", "-s", "-j2", "-C", str(root), f"OUT={out.name}"]
    return _timed("make", argv, stdout=subprocess.DEVNULL)


def time_floor(root: Path, n: int) -> float:
    """One run of benchmarks/floor_engine.py: the contract's file work per task in
    plain Python, nothing else (see its doc); the floor a Python engine reaches."""
    out = fresh(root, "out-floor")
    floor = Path(__file__).with_name("floor_engine.py")
    return _timed("floor", [sys.executable, str(floor), str(out), str(n)])


def time_doit(root: Path) -> float | None:
    try:
        import doit  # noqa: F401
    except ImportError:
        return None
    out = fresh(root, "out-doit")
    out.mkdir()
    argv = [sys.executable, "-m", "doit", "-n", "2", "-P", "process"]
    argv += ["-f", str(root / "dodo.py"), "--db-file", str(out / ".doit.db")]
    return _timed(
        "doit",
        argv,
        cwd=root,
        env={**os.environ, "OUT": str(out)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def fanout_rss(root: Path, n: int) -> tuple[float, float, float]:
    pack = root / "fan.toml"
    pack.write_text(
        'edition = 3\n[workflow]\nname = "fan"\n'
        '[[workflow.task]]\nname = "items"\nemits = { items = "array" }\n'
        f"run = '''printf '{{\"items\": [' > \"$CRUCIBLE_OUTPUT\"; seq -s, 1 {n} >> \"$CRUCIBLE_OUTPUT\"; printf ']}}' >> \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["items"]\nmap = "items.items"\n'
        'run = \'printf "{}" > "$CRUCIBLE_OUTPUT"\'\n'
    )
    state = fresh(root, "fan-state")
    t = time.perf_counter()
    subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "-j", "2"],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t
    rss_kib = worker_kib = 0
    with open(state / "session.jsonl", "rb") as f:
        for line in f:
            event = json.loads(line)
            if event["event"] == "run_finished":
                rss_kib = event["max_rss_kib"]
                worker_kib = event.get("worker_max_rss_kib", 0)
                assert event["counts"]["passed"] == n + 1, event
    return rss_kib / 1024, worker_kib / 1024, wall


def line(name: str, value: float, baseline: float | None, unit: str, budget: float | None) -> bool:
    if baseline is None:
        verdict = "" if budget is None else ("ok" if value <= budget else "OVER BUDGET")
        tail = "" if budget is None else f"budget {budget:g} {unit}  {verdict}"
        print(f"{name:<46} {value:9.3f} {unit:<4} {tail}")
        return budget is None or value <= budget
    ratio = value / baseline
    ok = budget is None or ratio <= budget
    tail = "" if budget is None else f"budget {budget:g}x  {'ok' if ok else 'OVER BUDGET'}"
    print(
        f"{name:<46} {value:9.3f} {unit:<4} baseline {baseline:8.3f} {unit}  ratio {ratio:5.2f}x  {tail}"
    )
    return ok


def _compile_bytecode() -> None:
    """Byte-compile crucible as pip does when it installs a wheel: an editable
    install under PYTHONDONTWRITEBYTECODE would otherwise recompile every module
    on every dispatcher start (~0.3 s), which is not the tool's cost."""
    import compileall

    import crucible

    for path in crucible.__path__:
        compileall.compile_dir(path, quiet=1)


def _cpu_line(kind: str, label: str, tasks: int, base: float | None) -> None:
    if not CPU[kind]:
        return
    cpu = statistics.median(CPU[kind])
    line(f"{label} (CPU user+sys, info)", cpu, base, "s", None)
    print(f"  CPU per task (info): {cpu / tasks * 1e3:.3f} ms")


def floor_lines(make: float, floor: float, from_pack: float, from_plan: float) -> list[str]:
    """What crucible costs over the floor (wall medians of one set of rounds),
    and what the wall budget leaves it over the floor in those rounds:
    ``WALL_BUDGET * make / floor``. Below 1 the budget is under the floor
    itself: in those rounds even floor_engine.py, which does the contract's
    file work in plain Python and nothing else, misses it."""
    leaves = WALL_BUDGET * make / floor
    return [
        f"  crucible over the floor (wall, info): from the pack {from_pack / floor:.2f}x, "
        f"from the plan {from_plan / floor:.2f}x",
        f"  the {WALL_BUDGET:g}x budget leaves crucible {leaves:.2f}x the floor"
        + ("  (below the floor itself)" if leaves < 1 else ""),
    ]


def workload_rounds(
    root: Path, args: argparse.Namespace, where: str, *, budget: bool
) -> tuple[bool, float]:
    """make, crucible (from the pack, from the plan, a cached rerun) and doit on
    the same workload, interleaved, ``--repeat`` rounds in fresh directories
    under ``root``; prints the medians. Returns (within the budgets, when
    ``budget``; make's median)."""
    plan = write_pack(root, args.tasks)
    pack = root / "pack.toml"
    write_makefile(root, args.tasks)
    write_dodo(root, args.tasks)
    cache = root / "cache"
    # the cache every cached rerun restores from (filled once, not timed)
    time_dispatch(pack, root, "cached", "--cache", str(cache))
    from_pack: list[float] = []
    from_plan: list[float] = []
    cached: list[float] = []
    make: list[float] = []
    doit_times: list[float] = []
    floor: list[float] = []
    for k in CPU:
        CPU[k].clear()
    for _ in range(args.repeat):  # interleaved, so load changes hit every tool alike
        make.append(time_make(root))
        from_pack.append(time_dispatch(pack, root, "pack"))
        from_plan.append(time_dispatch(plan, root, "plan"))
        cached.append(time_dispatch(pack, root, "cached", "--cache", str(cache)))
        floor.append(time_floor(root, args.tasks))
        d = time_doit(root)
        if d is not None:
            doit_times.append(d)
    m = statistics.median(make)
    p = statistics.median(from_pack)
    floor_wall = statistics.median(floor)
    print(
        f"# {where}: {args.tasks} independent sh tasks at -j 2, median of {args.repeat} "
        f"(os.cpu_count={os.cpu_count()})"
    )
    n = args.tasks
    ok = True
    for label, times in (("pack.toml, compile included", from_pack), ("plan", from_plan)):
        ok &= line(
            f"crucible-dispatch {n} tasks -j2 from the {label} (wall)",
            statistics.median(times),
            m,
            "s",
            WALL_BUDGET if budget else None,
        )
    line("floor: the same file work in plain Python (wall, info)", floor_wall, m, "s", None)
    for text in floor_lines(m, floor_wall, p, statistics.median(from_plan)):
        print(text)
    c = statistics.median(cached)
    ratio = c / p
    within = ratio <= CACHED_BUDGET
    verdict = ("ok" if within else "OVER BUDGET") if budget else "info"
    print(
        f"{'fully cached rerun of the pack (wall)':<46} {c:9.3f} s    uncached {p:8.3f} s  "
        f"ratio {ratio:5.2f}   budget {CACHED_BUDGET:g}  {verdict}"
    )
    ok &= within or not budget
    cpu_make = statistics.median(CPU["make"])
    line(f"make -j2 {n} tasks (CPU user+sys, info)", cpu_make, None, "s", None)
    print(f"  CPU per task (info): {cpu_make / n * 1e3:.3f} ms")
    _cpu_line("pack", f"crucible-dispatch {n} tasks from the pack", n, cpu_make)
    _cpu_line("plan", f"crucible-dispatch {n} tasks from the plan", n, cpu_make)
    _cpu_line("cached", "fully cached rerun", n, cpu_make)
    _cpu_line("doit", f"doit {n} tasks", n, cpu_make)
    _cpu_line("floor", "floor (plain Python)", n, cpu_make)
    if CPU["plan"]:
        over = statistics.median(CPU["plan"]) - cpu_make
        print(f"  crucible's CPU over make per task, from the plan (info): {over / n * 1e3:.3f} ms")
        if CPU["floor"]:
            over_floor = statistics.median(CPU["plan"]) - statistics.median(CPU["floor"])
            print(
                "  crucible's CPU over the floor per task, from the plan (info): "
                f"{over_floor / n * 1e3:.3f} ms"
            )
    if doit_times:
        line(f"doit {n} tasks -n 2 (wall)", statistics.median(doit_times), m, "s", None)
        for label, times in (("pack", from_pack), ("plan", from_plan)):
            beaten = sum(c < d for c, d in zip(times, doit_times, strict=True))
            rounds = ", ".join(f"{c:.3f}/{d:.3f}" for c, d in zip(times, doit_times, strict=True))
            faster = beaten == len(times)
            verdict = ("ok" if faster else "OVER BUDGET") if budget else "info"
            print(
                f"crucible (from the {label}) faster than doit in {beaten} of {len(times)} "
                f"rounds (s: {rounds})  {verdict}"
            )
            ok &= faster or not budget
    else:
        print("doit: not installed (pip install doit), not measured")
    return ok, m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--fanout", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chain", type=int, default=500, help="tasks in the chain workload (0: none)")
    ap.add_argument(
        "--snakemake",
        metavar="EXE",
        help="also time this snakemake once on the same workload (no budget)",
    )
    ap.add_argument(
        "--settle",
        type=float,
        default=420.0,
        help="wait up to this many seconds for the filesystem to settle (0: do not wait)",
    )
    args = ap.parse_args()
    if args.snakemake and shutil.which(args.snakemake) is None:
        print(f"--snakemake: {args.snakemake}: no such program", file=sys.stderr)
        return 2
    if shutil.which("make") is None:
        print("make not found: cannot measure the baseline", file=sys.stderr)
        return 3
    ok = True
    _compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="bench-dispatch-") as tmp:
        root = Path(tmp)
        cost = settle(root, args.settle)
        hint = (
            "  (inflated: many files were deleted here in the last minutes)"
            if cost > SETTLED_US
            else ""
        )
        print(f"# inode creation on this filesystem now: {cost:.1f} us per inode{hint}")
        within, m = workload_rounds(root, args, "disk", budget=True)
        ok &= within
        if args.snakemake:
            write_snakefile(root, args.tasks)
            line(
                f"snakemake {args.tasks} tasks -j 2 (wall, once, no budget)",
                time_snakemake(root, args.snakemake),
                m,
                "s",
                None,
            )
        else:
            print("snakemake: not measured (--snakemake EXE; ~30 s a run here)")
        if args.chain > 0:
            print(f"# a chain of {args.chain} of the same tasks on the disk (reported, no budget)")
            chain_rounds(root / "chain", args.chain, args.repeat)
        with tmpfs_dir("bench-dispatch-") as (tmpfs, where):
            print(f"# the same rounds on a tmpfs ({where}; reported, no budget)")
            workload_rounds(tmpfs, args, "tmpfs", budget=False)
        if args.fanout > 0:  # --fanout 0: the rounds alone
            rss, worker_rss, wall = fanout_rss(root, args.fanout)
            print(f"# {args.fanout}-instance fan-out at -j 2 took {wall:.1f} s")
            ok &= line(
                f"dispatcher peak RSS, {args.fanout}-instance fan-out",
                rss,
                None,
                "MiB",
                RSS_BUDGET_MIB,
            )
            # Forked workers share most pages with the dispatcher; each one's own peak:
            line("  largest staging worker's peak RSS (info)", worker_rss, None, "MiB", None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
