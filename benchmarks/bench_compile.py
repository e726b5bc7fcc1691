"""Benchmark crucible-compile against baselines measured in the same run.

1. Compiling a generated 10,000-task edition-3 pack (validation included) vs the
   irreducible cost: ``tomllib.loads`` of the same manifest + ``orjson.dumps`` of
   the resulting plan. Budget: 3x.
2. ``crucible-compile --help`` cold start vs ``python -c pass``. Budget: +150 ms.
3. A matrix's combinations (``crucible.compile._matrix_rules``, what compile counts
   and dispatch expands) over a 100,000-value axis with 1,000 ``exclude`` and 1,000
   ``include`` entries vs the same axis with none: matching is linear, not
   combinations x entries (issue 27 item 19: 10 s with 100 excludes). Budget: 3x.

Prints one line per figure; exits 1 if a budget is exceeded.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import orjson

from crucible.compile import compile_bytes

TASKS = 10_000
COMPILE_BUDGET = 3.0
STARTUP_BUDGET_MS = 150.0
MATRIX_VALUES = 100_000
MATRIX_ENTRIES = 1_000
MATRIX_BUDGET = 3.0


def generate(n: int) -> str:
    """An edition-3 pack: a wide DAG where each task needs up to three earlier ones,
    declares inputs from them, and every tenth fans out over an array."""
    out = [
        'edition = 3\n\n[workflow]\nname = "bench"\n\n[workflow.params.k]\ntype = "integer"\ndefault = 1\n'
    ]
    for i in range(n):
        needs = [f"t{j}" for j in (i - 1, i - 7, i - 31) if j >= 0]
        lines = [
            "[[workflow.task]]",
            f'name = "t{i}"',
            f'run = ["python3", "-c", "print({i})"]',
            'emits = { v = "integer", xs = "array", s = "string" }',
        ]
        if needs:
            lines.append("needs = [" + ", ".join(f'"{n}"' for n in needs) + "]")
            lines.append("inputs = { " + ", ".join(f'{n} = "{n}.v"' for n in needs) + " }")
            if i % 10 == 0:
                lines.append(f'map = "{needs[0]}.xs"')
        if i % 5 == 0:
            lines.append('join = "settled"')
            lines.append("retries = 2")
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def best_of(runs: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def startup_ms(argv: list[str], runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> int:
    text = generate(TASKS)
    data = text.encode()
    compiled = compile_bytes(data, "bench.toml", Path("."))
    assert len(compiled.plan["tasks"]) == TASKS
    plan = compiled.plan

    def baseline() -> None:
        tomllib.loads(text)
        orjson.dumps(plan, option=orjson.OPT_SORT_KEYS)

    base = best_of(5, baseline)
    ours = best_of(5, lambda: compile_bytes(data, "bench.toml", Path(".")))
    ratio = ours / base
    ok = True
    print(
        f"compile {TASKS} tasks: {ours * 1000:.0f} ms; baseline tomllib.loads+orjson.dumps "
        f"{base * 1000:.0f} ms; ratio {ratio:.2f}x; budget {COMPILE_BUDGET:.1f}x "
        f"[{'ok' if ratio <= COMPILE_BUDGET else 'OVER'}]"
    )
    ok &= ratio <= COMPILE_BUDGET

    exe = Path(sys.executable).parent / "crucible-compile"
    python = startup_ms([sys.executable, "-c", "pass"])
    help_ = startup_ms([str(exe), "--help"])
    extra = help_ - python
    print(
        f"crucible-compile --help cold start: {help_:.0f} ms; baseline python -c pass "
        f"{python:.0f} ms; +{extra:.0f} ms (ratio {help_ / python:.2f}x); budget "
        f"+{STARTUP_BUDGET_MS:.0f} ms [{'ok' if extra <= STARTUP_BUDGET_MS else 'OVER'}]"
    )
    ok &= extra <= STARTUP_BUDGET_MS
    ok &= matrix_figure()
    return 0 if ok else 1


def matrix_figure() -> bool:
    from crucible.compile._fanout import MAX_INSTANCES
    from crucible.compile._matrix_rules import matrix_combinations

    axes = [("x", list(range(MATRIX_VALUES)))]
    exclude = [{"x": i} for i in range(0, MATRIX_VALUES, MATRIX_VALUES // MATRIX_ENTRIES)]
    include = [
        {"x": i + 1, "tag": i} for i in range(0, MATRIX_VALUES, MATRIX_VALUES // MATRIX_ENTRIES)
    ]
    plain = best_of(3, lambda: matrix_combinations(axes, limit=MAX_INSTANCES))
    ruled = best_of(3, lambda: matrix_combinations(axes, exclude, include, limit=MAX_INSTANCES))
    ratio = ruled / plain
    print(
        f"matrix of {MATRIX_VALUES:,} values with {MATRIX_ENTRIES:,} excludes and "
        f"{MATRIX_ENTRIES:,} includes: {ruled * 1000:.0f} ms; baseline without them "
        f"{plain * 1000:.0f} ms; ratio {ratio:.2f}x; budget {MATRIX_BUDGET:.1f}x "
        f"[{'ok' if ratio <= MATRIX_BUDGET else 'OVER'}]"
    )
    return ratio <= MATRIX_BUDGET


if __name__ == "__main__":
    sys.exit(main())
