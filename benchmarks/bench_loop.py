"""Scored-loop benchmark (issue 18): the loop machinery's per-revision overhead.

A no-op body (``propose`` writes ``{}``, ``evaluate`` a constant score) run as a
scored loop of R revisions, against the same body run as a plain pack once per
revision: R copies of the two tasks chained one after the other (copy i+1 needs
copy i), so both runs start the same 2R task processes in the same order, one
revision at a time. What the loop adds per revision — the reserved inputs
written before it, the revision's scoring and loop.json, the revision keys'
paths — is the difference. Both run in this process through
``crucible.run.run_plan`` (one session each), interleaved, each into a fresh
state dir (nothing is deleted until the end: ext4 without a journal).

A second baseline is the issue's own wording: the same body as a plain
two-task pack, run once per revision (R runs of ``run_plan``, as a shell loop
around crucible-dispatch would). The budget is held against it; the chained
comparison is stricter (it pays one session for all revisions) and is printed
beside it, with no budget.

Budget: loop / (the plain pack run once per revision) <= 1.5.

Run: python benchmarks/bench_loop.py [--revisions R] [--repeat N]
Exits 1 if the budget is exceeded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BUDGET = 1.5

PROPOSE = """[[workflow.task]]
name = "{name}"
run = "echo '{{}}' > \\"$CRUCIBLE_OUTPUT\\""
{needs}
"""
EVALUATE = """[[workflow.task]]
name = "{name}"
kind = "evaluate"
needs = ["{propose}"]
run = "echo '{{\\"score\\": 1, \\"verdict\\": \\"pass\\"}}' > \\"$CRUCIBLE_OUTPUT\\""
emits = {{ score = "integer" }}
"""
HEAD = 'edition = 4\n\n[workflow]\nname = "{name}"\n\n'


def write_loop(root: Path, revisions: int) -> Path:
    text = HEAD.format(name="bench-loop")
    text += PROPOSE.format(name="propose", needs="")
    text += EVALUATE.format(name="evaluate", propose="propose")
    text += (
        '[loop]\nbody = ["propose", "evaluate"]\nscore = "evaluate"\nmetric = "score"\n'
        f"max_revisions = {revisions}\n"
    )
    path = root / "loop.toml"
    path.write_text(text)
    return path


def write_chain(root: Path, revisions: int) -> Path:
    text = HEAD.format(name="bench-chain")
    for i in range(1, revisions + 1):
        needs = "" if i == 1 else f'needs = ["evaluate{i - 1}"]'
        text += PROPOSE.format(name=f"propose{i}", needs=needs)
        text += EVALUATE.format(name=f"evaluate{i}", propose=f"propose{i}")
    path = root / "chain.toml"
    path.write_text(text)
    return path


def _timed(plan: Path, state: Path) -> float:
    from crucible.run._options import RunOptions
    from crucible.run.session._runner import run_plan

    options = RunOptions(plan=plan, state=state, jobs=2)
    t = time.perf_counter()
    outcome = run_plan(options, environ={"PATH": os.environ["PATH"]})
    elapsed = time.perf_counter() - t
    if outcome.exit_code != 0:
        raise SystemExit(f"{plan.name}: the run failed ({outcome.status})")
    return elapsed


def write_body(root: Path) -> Path:
    text = HEAD.format(name="bench-body")
    text += PROPOSE.format(name="propose", needs="")
    text += EVALUATE.format(name="evaluate", propose="propose")
    path = root / "body.toml"
    path.write_text(text)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--revisions", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-loop-"))
    try:
        loop, chain = write_loop(root, args.revisions), write_chain(root, args.revisions)
        body = write_body(root)
        n = args.revisions
        looped, plain, once = [], [], []
        for r in range(args.repeat):
            plain.append(_timed(chain, root / f"chain{r}"))
            looped.append(_timed(loop, root / f"loop{r}"))
            once.append(sum(_timed(body, root / f"once{r}-{i}") for i in range(n)))
        p, lo, o = statistics.median(plain), statistics.median(looped), statistics.median(once)
        ratio = lo / o
        print(f"revisions: {n}, no-op body of 2 tasks, -j 2, median of {args.repeat}")
        print(
            f"plain pack, the body chained {n} times: {p:8.3f} s  ({p / n * 1000:6.1f} ms/revision)"
        )
        print(
            f"scored loop, {n} revisions:            {lo:8.3f} s  ({lo / n * 1000:6.1f} ms/revision)"
        )
        print(
            f"plain pack run once per revision:      {o:8.3f} s  ({o / n * 1000:6.1f} ms/revision)"
        )
        print(f"per-revision overhead over the chain:  {(lo - p) / n * 1000:8.2f} ms")
        print(f"loop / chained plain pack (info):      {lo / p:8.2f}x")
        print(f"loop / plain pack once per revision:   {ratio:8.2f}x  (budget {BUDGET}x)")
        return 0 if ratio <= BUDGET else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
