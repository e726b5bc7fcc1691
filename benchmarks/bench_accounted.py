"""Benchmark: export + verify of a 1,000-instance accounted run, against reading and
hashing the bundle's bytes (issue 28, "Done means").

Figure: (``crucible-prove --state`` export time + ``crucible-verify`` time) /
(read + SHA-256 of every byte of the exported bundle) <= 10.

The state dir is a real run's: ``crucible-dispatch`` runs a 1,000-instance accounted
fan-out once, untimed (a root task ``org`` emitting 1,000 organisations, a task
``people`` mapped over them, keyed by id, each emitting a few people). With
``--synthetic`` the state dir is instead generated here from the specs
(docs/spec/export.md §4 and §6), for a quick look without dispatching. Export, verify
and baseline each run in a fresh subprocess that times its own work (imports
excluded, as bench_verify.py does); every export writes a fresh directory; each
figure is the best of 3 (the machine is shared). Exit 1 when over budget.

    python benchmarks/bench_accounted.py               # dispatches the run first
    python benchmarks/bench_accounted.py --synthetic   # a generated state dir
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

INSTANCES = 1000
BUDGET = 10.0
ROUNDS = 3
AT = "2026-10-17T09:00:00Z"


def dumps(v: Any) -> bytes:
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS)  # ASCII keys, no floats: JCS


def dg(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


BIN = Path(sys.executable).parent

PACK = """edition = 4
[workflow]
name = "bench-accounted"
[workflow.params.count]
type = "integer"
default = 1000
[workflow.limits]
max_bytes = 1073741824
max_instances = 2000
max_records = 4000
[[workflow.task]]
name = "org"
emits = { orgs = "array" }
run = '''python3 -c 'import json, os; n = json.load(open(os.path.join(os.environ["CRUCIBLE_INPUTS_DIR"], "params")))["count"]; json.dump({"orgs": [{"id": f"o{i}", "name": f"Organisation {i}"} for i in range(n)]}, open(os.environ["CRUCIBLE_OUTPUT"], "w"))' '''
[[workflow.task]]
name = "people"
needs = ["org"]
map = "org.orgs"
key = "id"
emits = { people = "array" }
run = '''printf '{"people": [{"name": "Person 1", "role": "staff"}, {"name": "Person 2", "role": "staff"}, {"name": "Person 3", "role": "staff"}]}' > "$CRUCIBLE_OUTPUT"'''
"""


def dispatched(root: Path, n: int) -> Path:
    """The state dir of a real accounted run of ``n`` instances (untimed)."""
    pack = root / "pack.toml"
    pack.write_text(PACK)
    state = root / "state"
    env = {**os.environ, "SOURCE_DATE_EPOCH": "1790000000"}
    argv = [str(BIN / "crucible-dispatch"), str(pack), "--state", str(state), "-j", "2"]
    subprocess.run(
        [*argv, "-p", f"count={n}", "--actor", "bench"],
        check=True,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    return state


def generate(state: Path, n: int) -> None:
    """An ended accounted run's state dir with ``n`` mapped instances."""
    arts = state / "proof" / "artifacts"
    arts.mkdir(parents=True)
    (state / "plan.json").write_bytes(b"{}")
    stages = [
        {
            "name": "org",
            "input": {"fromStage": None, "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "/orgs", "cardinality": "many"},
        },
        {
            "name": "people",
            "input": {"fromStage": "org", "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "", "cardinality": "one"},
        },
    ]
    limits = {
        "maxBytes": 1 << 30,
        "maxFiles": 1 << 20,
        "maxInstances": n + 1,
        "maxAttempts": 4,
        "maxRecords": 2 * n,
        "maxCaseBytes": 4096,
        "maxPayloadBytes": 4096,
    }
    wf = {"workflowVersion": 2, "name": "bench-accounted", "limits": limits, "stages": stages}
    (state / "workflow.json").write_bytes(dumps(wf))
    ops: list[dict[str, Any]] = []

    def put(rel: str, value: Any) -> str:
        p = arts / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(dumps(value))
        return rel

    def attempt(task: str, key: str | None, iid: str, case: Any, audit: Any) -> None:
        base = f"attempts/{iid}/1"
        files = {
            "run": put(
                f"{base}/run.json",
                {
                    "exportVersion": 3,
                    "finishedAt": AT,
                    "task": task,
                    "key": key,
                    "attempt": 1,
                    "exitCode": 0,
                },
            ),
            "preparation": put(
                f"{base}/preparation.json",
                {"task": task, "key": key, "caseDigest": dg(dumps(case))},
            ),
            "audit": put(f"{base}/audit.json", audit),
        }
        ops.append(
            {
                "op": "observe",
                "instance": iid,
                "attempt": 1,
                "state": "evaluated",
                "failure": None,
                "files": files,
            }
        )

    root_case = {"params": {"count": n}}
    put("root-case.json", root_case)
    ops.append(
        {"op": "root", "execution": "x-bench", "rootInstance": "org", "case": "root-case.json"}
    )
    ops.append({"op": "group", "reservation": 1, "starts": ["org"], "cancelled": []})
    orgs = [{"name": f"Organisation {i}", "site": f"https://org{i}.example"} for i in range(n)]
    attempt("org", None, "org", root_case, {"orgs": orgs})
    ids = [f"people.{i}" for i in range(n)]
    ops.append(
        {
            "op": "select",
            "stage": "org",
            "review": {"actor": "bench", "at": AT},
            "selected": [{"instance": "org", "output": i} for i in range(n)],
            "childIds": ids,
        }
    )
    ops.append({"op": "group", "reservation": 3, "starts": ids, "cancelled": []})
    for i, iid in enumerate(ids):
        people = {"people": [{"name": f"Person {i}.{j}", "role": "staff"} for j in range(3)]}
        attempt("people", str(i), iid, orgs[i], people)
    (state / "operations.ndjson").write_bytes(b"".join(dumps(o) + b"\n" for o in ops))
    shutdown = {"event": "shutdown", "session": 1, "reason": "completed", "exit_code": 0}
    (state / "session.jsonl").write_bytes(dumps(shutdown) + b"\n")


_CHILD = r"""
import json, sys, time
from pathlib import Path
kind, a, b = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if kind == "baseline":
    import hashlib, os
    t = time.perf_counter()
    n = files = 0
    for dirpath, _, names in os.walk(a):
        for name in names:
            data = (Path(dirpath) / name).read_bytes()
            hashlib.sha256(data).digest()
            n += len(data)
            files += 1
    out = {"seconds": time.perf_counter() - t, "bytes": n, "files": files}
elif kind == "export":
    from crucible.proof.writer import ExportOptions, export
    import crucible.proof.writer._export, crucible.proof.writer._engine  # imports untimed
    t = time.perf_counter()
    result = export(ExportOptions(a, b))
    out = {"seconds": time.perf_counter() - t, "partial": result.partial, "bytes": result.bytes}
else:
    from crucible.proof.reader import VerifyOptions, verify_bundle
    import crucible.proof.reader._verify  # imports untimed
    t = time.perf_counter()
    report = verify_bundle(a, VerifyOptions())
    out = {"seconds": time.perf_counter() - t, "report": report.to_json()}
print(json.dumps(out))
"""


def child(kind: str, a: Path, b: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(a), str(b)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench_accounted: {kind} failed: {proc.stderr.strip()[-500:]}")
    value: dict[str, Any] = json.loads(proc.stdout)
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true", help="generate the state dir")
    ap.add_argument("-n", type=int, default=INSTANCES, help="instances (default 1000)")
    args = ap.parse_args()
    base = (
        Path("/dev/shm") if Path("/dev/shm").is_dir() and os.access("/dev/shm", os.W_OK) else None
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-accounted-", dir=base))
    try:
        if args.synthetic:
            state = tmp / "state"
            generate(state, args.n)
        else:
            state = dispatched(tmp, args.n)
        exports, verifies, baselines = [], [], []
        for k in range(ROUNDS):
            bundle = tmp / f"bundle-{k}"  # a fresh directory every round
            exported = child("export", state, bundle)
            if exported["partial"] is not None:
                raise SystemExit(f"bench_accounted: the export is partial: {exported}")
            read = child("verify", bundle, bundle)
            report = read["report"]
            if report.get("verdict") != "reading" or report["reading"]["completion"] != "complete":
                raise SystemExit(f"bench_accounted: the bundle does not read complete: {report}")
            exports.append(exported["seconds"])
            verifies.append(read["seconds"])
            baselines.append(child("baseline", bundle, bundle))
            shutil.rmtree(bundle)
        baseline = min(baselines, key=lambda r: float(r["seconds"]))
        t_export, t_verify = min(exports), min(verifies)
        ratio = (t_export + t_verify) / baseline["seconds"]
        verdict = "ok" if ratio <= BUDGET else "OVER BUDGET"
        print(
            f"export + verify of a {args.n:,}-instance bundle "
            f"({'generated' if args.synthetic else 'dispatched'}) vs read+sha256 of its bytes: "
            f"{t_export:.3f} s + {t_verify:.3f} s (baseline {baseline['seconds']:.3f} s, "
            f"{baseline['bytes'] / 1e6:.2f} MB in {baseline['files']} files) "
            f"ratio {ratio:.2f}, budget {BUDGET:.2f}: {verdict}"
        )
        return 0 if ratio <= BUDGET else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
