"""Edition-4 fan-outs at scale: a matrix of N x N combinations against the plain
map of the same width, both run by ``crucible-dispatch`` in this process's session.

Prints, for the matrix and its baseline (``map = "items.items"`` over N*N items):
the dispatcher's peak RSS (``run_finished.max_rss_kib``, budget 300 MiB at 10,000
instances, as for the existing fan-out; bench_dispatch.py) and the wall-clock
ratio matrix / map. Also the time to expand the combinations in-process
(``crucible.run.matrix.combinations``) against building the same number of dicts
with ``itertools.product`` (the floor of any expansion).

    python benchmarks/bench_fanout.py            # 100 x 100 = 10,000 instances
    python benchmarks/bench_fanout.py --side 20  # a quick run
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")
RSS_BUDGET_MIB = 300.0


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
        [DISPATCH, str(pack), "--state", str(state), "-j", "2"],
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
    from crucible.run.matrix import combinations

    axes = [("a", list(range(side))), ("b", list(range(side)))]
    t = time.perf_counter()
    combos = combinations(axes)
    ours = time.perf_counter() - t
    t = time.perf_counter()
    floor = [{"a": a, "b": b} for a, b in itertools.product(range(side), range(side))]
    base = time.perf_counter() - t
    assert len(combos) == len(floor)
    return ours, base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=100, help="axis length (N x N combinations)")
    args = ap.parse_args()
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
