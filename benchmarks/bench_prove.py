"""Benchmark: proving is linear in the number of epochs, with bounded memory.

A generated run (root → 64 reserved children → one group → explicit retries until
the proof holds N epochs; every 16th retry retains a run file) is proved at
N = 8,192 (the baseline, same script) and N = 131,072 (the format's structural
maximum: 32 blocks × 4096 epochs). Each size runs in its own subprocess so its
peak RSS is its own. Budgets: time per epoch at 131,072 within 1.5× of the
8,192 figure; peak RSS at 131,072 at most 512 MiB.

The 8 MiB proof ceiling cannot hold 131,072 epochs (every epoch carries a 71-byte
previousProofDigest), so this benchmark raises the ceiling for the measurement only
(``proof_ceiling``); the bound itself is tested in tests/proof. The candidate
cross-check mode is off (it is quadratic by design); durability (fsync of every file
before the swap) is off too, so the figure is the writer's own work.

Run: ``python benchmarks/bench_prove.py`` (exit 1 if a budget is exceeded).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL, LARGE = 8_192, 131_072
RATIO_BUDGET = 1.5
RSS_BUDGET_MIB = 512
CHILDREN = 64
AT = "2026-10-17T09:00:00Z"


def generate(root: Path, epochs: int) -> tuple[Path, Path, Path]:
    """Write workflow, operation log and artifacts for a run of exactly ``epochs``."""
    from crucible.core import canon

    art = root / "artifacts"
    art.mkdir(parents=True)
    (art / "case.json").write_bytes(canon.dumps({"topic": "benchmark"}))
    (art / "run.json").write_bytes(canon.dumps({"exportVersion": 3, "finishedAt": AT}))
    (art / "prep.json").write_bytes(canon.dumps({"prepared": True}))
    (art / "audit.json").write_bytes(
        canon.dumps({"items": [{"name": f"item-{i}"} for i in range(CHILDREN)]})
    )
    big = 2**50
    workflow = {
        "workflowVersion": 2,
        "name": "bench",
        "limits": {
            "maxBytes": big,
            "maxFiles": big,
            "maxInstances": 10_000,
            "maxAttempts": big,
            "maxRecords": big,
            "maxCaseBytes": 65536,
            "maxPayloadBytes": 65536,
        },
        "stages": [
            {
                "name": "seed",
                "input": {"fromStage": None, "fields": None, "admitMaxBytes": None},
                "output": {"pointer": "/items", "cardinality": "many"},
            },
            {
                "name": "work",
                "input": {"fromStage": "seed", "fields": ["name"], "admitMaxBytes": None},
                "output": {"pointer": "/items", "cardinality": "many"},
            },
        ],
    }
    wf = root / "workflow.json"
    wf.write_bytes(canon.dumps(workflow))
    ids = [f"w-{i:03d}" for i in range(CHILDREN)]
    ops = root / "operations.ndjson"
    with ops.open("wb") as f:

        def op(**kw: object) -> None:
            f.write(canon.dumps(kw) + b"\n")

        op(op="root", execution="bench", rootInstance="root", case="case.json")
        op(op="group", reservation=1, starts=["root"], cancelled=[])
        op(
            op="observe",
            instance="root",
            attempt=1,
            state="evaluated",
            failure=None,
            files={"run": "run.json", "preparation": "prep.json", "audit": "audit.json"},
        )
        op(
            op="select",
            stage="seed",
            review={"actor": "bench", "at": AT},
            selected=[{"instance": "root", "output": i} for i in range(CHILDREN)],
            childIds=ids,
        )
        op(op="group", reservation=3, starts=ids, cancelled=[])
        for i in ids:
            op(
                op="observe",
                instance=i,
                attempt=1,
                state="failed",
                failure="acquisition-failed",
                files={},
            )
        attempts = dict.fromkeys(ids, 1)
        for n in range(epochs - 4):
            i = ids[n % CHILDREN]
            attempts[i] += 1
            op(op="retry", instance=i, actor="bench", at=AT)
            files = {"run": "run.json"} if n % 16 == 0 else {}
            op(
                op="observe",
                instance=i,
                attempt=attempts[i],
                state="failed",
                failure="acquisition-failed",
                files=files,
            )
        op(op="finish", files={})
    return wf, ops, art


def one(epochs: int) -> dict[str, float]:
    """Prove one generated run in this process; report seconds and peak RSS."""
    from crucible.proof.writer import ProveOptions, prove

    with tempfile.TemporaryDirectory(prefix="crucible-bench-prove-") as tmp:
        root = Path(tmp)
        wf, ops, art = generate(root, epochs)
        start = time.perf_counter()
        result = prove(
            ProveOptions(
                wf,
                ops,
                art,
                root / "bundle",
                proof_ceiling=1 << 40,
                durable=False,
                keep_decisions=False,
            )
        )
        seconds = time.perf_counter() - start
        assert result.epochs == epochs, result.epochs
        assert result.unrecordable is None and result.partial is None
        proof_bytes = (root / "bundle" / "admission-proof.json").stat().st_size
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "rss_mib": rss_mib, "proof_bytes": proof_bytes}


def measure(epochs: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(epochs)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(one(int(sys.argv[2]))))
        return 0
    small = min((measure(SMALL) for _ in range(3)), key=lambda r: r["seconds"])
    large = min((measure(LARGE) for _ in range(2)), key=lambda r: r["seconds"])
    per_small = small["seconds"] / SMALL * 1e6
    per_large = large["seconds"] / LARGE * 1e6
    ratio = per_large / per_small
    ok_time = ratio <= RATIO_BUDGET
    ok_rss = large["rss_mib"] <= RSS_BUDGET_MIB
    print(
        f"prove {SMALL:>7} epochs: {small['seconds']:.2f} s, {per_small:.1f} us/epoch "
        f"(baseline), peak RSS {small['rss_mib']:.0f} MiB, proof {small['proof_bytes'] / 2**20:.1f} MiB"
    )
    print(
        f"prove {LARGE:>7} epochs: {large['seconds']:.2f} s, {per_large:.1f} us/epoch, "
        f"ratio {ratio:.2f} (budget {RATIO_BUDGET}) {'ok' if ok_time else 'OVER BUDGET'}"
    )
    print(
        f"peak RSS at {LARGE} epochs: {large['rss_mib']:.0f} MiB (budget {RSS_BUDGET_MIB} MiB) "
        f"{'ok' if ok_rss else 'OVER BUDGET'}; proof {large['proof_bytes'] / 2**20:.1f} MiB"
    )
    return 0 if ok_time and ok_rss else 1


if __name__ == "__main__":
    sys.exit(main())
