"""Benchmark the typed plan model's start-up against a baseline measured in the same run.

1. ``Plan.from_json(plan, checked=True)`` of a compiled 10,000-task plan (the
   bench_compile pack: inputs from up to three producers, a fan-out every tenth
   task) vs ``orjson.loads`` of the same plan's bytes: what a run pays to read
   its plan as typed values, next to what reading its JSON costs at all.
   Budget: 2x (issue 31 item 1; it was ~2.5x before the checked reader set only
   the members a task has).
2. Admission (``crucible.run.session._admit.admit``, a dry run) of a 1,000- and a
   10,000-task ``pack.toml``, in process, vs ``orjson.loads`` of the plan's bytes:
   printed, not budgeted (compiling the manifest is most of it, and
   bench_compile holds compile to its budget); the model is built once, by
   compile, and admission takes it.

Prints one line per figure; exits 1 if a budget is exceeded.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import orjson
from bench_compile import best_of, generate

from crucible.compile import compile_bytes
from crucible.core.plan import Plan
from crucible.run._options import RunOptions
from crucible.run.session._admit import admit

TASKS = 10_000
MODEL_BUDGET = 2.0
ADMITTED = (1_000, 10_000)


def model_figure() -> bool:
    compiled = compile_bytes(generate(TASKS).encode(), "bench.toml", Path("."))
    plan, data = compiled.plan, compiled.data
    base = best_of(7, lambda: orjson.loads(data))
    ours = best_of(7, lambda: Plan.from_json(plan, checked=True))
    ratio = ours / base
    print(
        f"plan model of {TASKS:,} tasks (checked): {ours * 1000:.1f} ms; baseline "
        f"orjson.loads of its bytes {base * 1000:.1f} ms; ratio {ratio:.2f}x; budget "
        f"{MODEL_BUDGET:.1f}x [{'ok' if ratio <= MODEL_BUDGET else 'OVER'}]"
    )
    return ratio <= MODEL_BUDGET


def admission_figures() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-plan-model-") as tmp:
        for n in ADMITTED:
            pack = Path(tmp) / f"pack{n}.toml"
            pack.write_text(generate(n))
            options = RunOptions(plan=pack, state=Path(tmp) / f"state{n}", dry_run=True)
            data = compile_bytes(pack.read_bytes(), str(pack), pack.parent).data
            base = best_of(5, lambda: orjson.loads(data))  # noqa: B023 (called here)
            ours = best_of(3, lambda: admit(options, dict(os.environ)))  # noqa: B023
            print(
                f"admission of a {n:,}-task pack.toml (dry run, in process): "
                f"{ours * 1000:.0f} ms; baseline orjson.loads of its plan "
                f"{base * 1000:.1f} ms; ratio {ours / base:.1f}x (no budget)"
            )


def main() -> int:
    ok = model_figure()
    admission_figures()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
