"""A fan-out over a fan-out's outputs (issue 32 item 1) against the plain fan-out
of the same width, both run by ``crucible-dispatch`` from this process.

``fold``: ``gen`` maps over ``--outer`` items, each instance emitting an array of
``--inner`` numbers; ``each`` maps over ``gen.v`` (outer x inner instances, keyed
``<gen key>/<index>``). ``plain``: ``items`` emits outer x inner numbers at once and
``each`` maps over ``items.items`` (the baseline: the existing fan-out, IR v2). Each
timed round runs in a fresh state directory. Prints the wall time and the
dispatcher's peak RSS of each and their ratios (fold / plain; the fold run also
runs ``--outer`` more units), and the in-process expansion of the fold
(``crucible.run.engine._matrix._fold_pairs``) against building the plain pairs.

    python benchmarks/bench_fold.py                 # 100 x 100 = 10,000 instances
    python benchmarks/bench_fold.py --outer 20 --inner 10   # a quick run

Budget (exit 1 when over): the fold run at most ``--budget`` (default 1.5) times the
plain run's wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")
NOOP = 'run = \'printf "{}" > "$CRUCIBLE_OUTPUT"\'\n'


def fold_pack(root: Path, outer: int, inner: int) -> Path:
    pack = root / "fold.toml"
    pack.write_text(
        'edition = 4\n[workflow]\nname = "fold"\n'
        f'[[workflow.task]]\nname = "gen"\nmap = {{ count = {outer} }}\nemits = {{ v = "array" }}\n'
        f"run = '''printf '{{\"v\": [' > \"$CRUCIBLE_OUTPUT\"; seq -s, 1 {inner} "
        ">> \"$CRUCIBLE_OUTPUT\"; printf ']}' >> \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["gen"]\nmap = "gen.v"\n' + NOOP
    )
    return pack


def plain_pack(root: Path, n: int) -> Path:
    pack = root / "plain.toml"
    pack.write_text(
        'edition = 4\n[workflow]\nname = "plain"\n'
        '[[workflow.task]]\nname = "items"\nemits = { items = "array" }\n'
        f"run = '''printf '{{\"items\": [' > \"$CRUCIBLE_OUTPUT\"; seq -s, 1 {n} "
        ">> \"$CRUCIBLE_OUTPUT\"; printf ']}' >> \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["items"]\nmap = "items.items"\n' + NOOP
    )
    return pack


def run(pack: Path, state: Path, units: int) -> tuple[float, float]:
    """(wall seconds, dispatcher peak RSS MiB) of one run in a fresh ``state``."""
    t = time.perf_counter()
    subprocess.run(
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


def expansion(outer: int, inner: int) -> tuple[float, float]:
    """(fold expansion seconds, plain pairs seconds) for outer x inner elements."""
    from crucible.run.engine._folds import Fold, fold_pairs

    fold = Fold((str(i), list(range(inner))) for i in range(outer))
    t = time.perf_counter()
    pairs = fold_pairs(fold, "gen.v")
    ours = time.perf_counter() - t
    values = list(range(outer * inner))
    t = time.perf_counter()
    base = [(str(i), v) for i, v in enumerate(values)]
    floor = time.perf_counter() - t
    assert len(pairs) == len(base)
    return ours, floor


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outer", type=int, default=100)
    ap.add_argument("--inner", type=int, default=100)
    ap.add_argument("--budget", type=float, default=1.5)
    args = ap.parse_args()
    n = args.outer * args.inner
    ours, floor = expansion(args.outer, args.inner)
    print(
        f"expansion of {n:,}: fold {ours * 1e3:.1f} ms, plain pairs {floor * 1e3:.1f} ms, "
        f"ratio {ours / floor:.2f}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-fold-") as tmp:
        root = Path(tmp)
        f_wall, f_rss = run(
            fold_pack(root, args.outer, args.inner), root / "s-fold", n + args.outer
        )
        p_wall, p_rss = run(plain_pack(root, n), root / "s-plain", n + 1)
    print(f"fold  {args.outer} x {args.inner}: {f_wall:.2f} s, dispatcher peak RSS {f_rss:.1f} MiB")
    print(f"plain {n}: {p_wall:.2f} s, dispatcher peak RSS {p_rss:.1f} MiB")
    ratio = f_wall / p_wall
    print(f"ratio fold/plain: wall {ratio:.2f}, RSS {f_rss / p_rss:.2f}")
    within = ratio <= args.budget
    print(f"wall budget {args.budget:.2f}: {'within' if within else 'OVER'}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
