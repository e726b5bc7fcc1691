"""Accounting while running (issue 28 item 2, docs/spec/export.md §4–§6), end to end
through real ``crucible-dispatch`` subprocesses: the run leaves an operation log
``crucible-prove`` rebuilds and ``crucible-verify`` reads; a refusal at exactly
``max_bytes + 1`` and an admission at exactly ``max_bytes``; opposite completion
orders give byte-identical logs and proofs; SIGTERM, ``--resume``, still verifies;
a refused selection; a bad ``--actor``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from crucible.compile import camel_limits
from crucible.core import canon
from crucible.core.plan import Plan
from crucible.proof.writer import ProveOptions
from crucible.proof.writer import prove as prove_lib
from crucible.run.accounting._book import workflow_document

BIN = Path(sys.executable).parent
DISPATCH = str(BIN / "crucible-dispatch")
PROVE = str(BIN / "crucible-prove")
VERIFY = str(BIN / "crucible-verify")

ORGS = '[{name = "acme"}, {name = "globex"}, {name = "initech"}]'

PACK = """edition = 4
[workflow]
name = "org-people"
[workflow.params.orgs]
type = "array"
default = ORGS
[workflow.limits]
max_bytes = MAX_BYTES
max_instances = MAX_INSTANCES
[[workflow.task]]
name = "org"
emits = { orgs = "array" }
run = '''
python3 -c 'import json,os; p=json.load(open(os.path.join(os.environ["CRUCIBLE_INPUTS_DIR"],"params"))); json.dump({"orgs": p["orgs"]}, open(os.environ["CRUCIBLE_OUTPUT"],"w"))'
'''
[[workflow.task]]
name = "people"
needs = ["org"]
map = "org.orgs"
emits = { person = "object" }
env = ["ACC_ORDER", "ACC_GATE", "ACC_FAIL"]
run = '''
python3 - <<'PY'
import json, os, time
d = os.environ["CRUCIBLE_INPUTS_DIR"]
it = json.load(open(os.path.join(d, "item")))
order = os.environ.get("ACC_ORDER", "")
names = ["acme", "globex", "initech"]
if order:
    i = names.index(it["name"])
    time.sleep(0.4 * (i if order == "asc" else len(names) - 1 - i))
if it["name"] == os.environ.get("ACC_FAIL"):
    raise SystemExit("failing on purpose")
gate = os.environ.get("ACC_GATE")
while gate and not os.path.exists(gate):
    time.sleep(0.05)
json.dump({"person": {"org": it["name"]}}, open(os.environ["CRUCIBLE_OUTPUT"], "w"))
PY
'''
"""

EPOCH = "1700000000"


def write_pack(tmp: Path, max_bytes: int = 1 << 20, max_instances: int = 64) -> Path:
    pack = tmp / "pack.toml"
    pack.write_text(
        PACK.replace("ORGS", ORGS)
        .replace("MAX_BYTES", str(max_bytes))
        .replace("MAX_INSTANCES", str(max_instances))
    )
    return pack


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ACC_")}
    e["SOURCE_DATE_EPOCH"] = EPOCH
    e.update(extra)
    return e


def dispatch(pack: Path, state: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "--actor", "tester", *args],
        capture_output=True,
        text=True,
        env=env(**extra),
        check=False,
        timeout=120,
    )


def prove(state: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            PROVE,
            "--workflow",
            str(state / "workflow.json"),
            "--operations",
            str(state / "operations.ndjson"),
            "--artifacts",
            str(state / "proof" / "artifacts"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def verify(bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([VERIFY, str(bundle)], capture_output=True, text=True, check=False)


def ops(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "operations.ndjson").read_text().splitlines()]


def usage(state: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state / "proof" / "usage.json").read_text())
    return data


def records(state: Path, task: str) -> dict[str, dict[str, Any]]:
    path = state / "results" / f"{task}.jsonl"
    out: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "key" in rec and "status" in rec:
            out[rec["key"]] = rec
    return out


def test_a_run_leaves_a_log_prove_rebuilds_and_verify_reads(tmp_path: Path) -> None:
    pack, state = write_pack(tmp_path), tmp_path / "st"
    proc = dispatch(pack, state)
    assert proc.returncode == 0, proc.stderr
    kinds = [o["op"] for o in ops(state)]
    assert kinds == ["root", "group", "observe", "select", "group", *["observe"] * 3]
    select = ops(state)[3]
    # the prospective child ids are the instance keys exactly as staged
    assert select["childIds"] == ["people.0", "people.1", "people.2"]
    assert select["review"] == {"actor": "tester", "at": "2023-11-14T22:13:20Z"}
    assert json.loads((state / "workflow.json").read_text())["workflowVersion"] == 2
    bundle = tmp_path / "bundle"
    made = prove(state, bundle)
    assert made.returncode == 0, made.stderr
    read = verify(bundle)
    assert read.returncode == 0, read.stdout + read.stderr
    used = usage(state)["used"]
    assert used["instances"] == 4 and used["records"] == 6
    # the run's own measure is the bundle's (the partial label is never charged)
    files = [p for p in bundle.rglob("*") if p.is_file() and p.name != "partial.json"]
    assert used["files"] == len(files)
    assert used["bytes"] == sum(p.stat().st_size for p in files)


def test_admitted_at_exactly_max_bytes_refused_at_one_more(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    # a bound of the same number of digits: the limit is part of workflow.json's bytes
    assert dispatch(write_pack(probe_dir(probe), max_bytes=99999), probe / "st").returncode == 0
    exact = usage(probe / "st")["used"]["bytes"]

    at = tmp_path / "at"
    proc = dispatch(write_pack(probe_dir(at), max_bytes=exact), at / "st")
    assert proc.returncode == 0, proc.stderr
    assert usage(at / "st")["used"]["bytes"] == exact
    # admitted at exactly max_bytes, the export of the state dir still verifies complete
    exported = subprocess.run(
        [PROVE, "--state", str(at / "st"), "--out", str(at / "bundle")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert exported.returncode == 0, exported.stderr
    read = verify(at / "bundle")
    assert read.returncode == 0 and read.stdout.startswith("reading: complete"), read.stdout

    over = tmp_path / "over"
    proc = dispatch(write_pack(probe_dir(over), max_bytes=exact - 1), over / "st")
    assert proc.returncode == 1
    recs = records(over / "st", "people")
    assert recs["2"]["status"] == "failed"
    assert recs["2"]["note"] == "refused: would exceed max_bytes by 1"
    assert recs["0"]["status"] == "passed"
    assert usage(over / "st")["refusals"] == [
        {"task": "people", "key": "2", "note": "refused: would exceed max_bytes by 1"}
    ]
    # report: the refused unit's status names its bound; the bounds' use
    table = subprocess.run(
        [DISPATCH, "report", str(over / "st"), "people"], capture_output=True, text=True, check=True
    ).stdout
    assert any(
        line.startswith("people[2]") and "refused: max_bytes" in line for line in table.splitlines()
    )
    summary = subprocess.run(
        [DISPATCH, "report", str(over / "st")], capture_output=True, text=True, check=True
    ).stdout
    used = usage(over / "st")["used"]
    assert (
        f"accounting: bytes {used['bytes']} of {exact - 1}, files {used['files']} of 1048576, "
        "instances 4 of 64, records 5 of 65536"
    ) in summary
    rows = subprocess.run(
        [DISPATCH, "report", str(over / "st"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert json.loads(rows[-1]) == {"accounting": usage(over / "st")}
    (over / "report-row.stdout.json").write_text(rows[-1])  # the schema walker checks it
    last = ops(over / "st")[-1]
    assert last["instance"] == "people.2" and last["state"] == "evaluated"
    bundle = tmp_path / "bundle"
    assert prove(over / "st", bundle).returncode == 0
    assert verify(bundle).returncode == 0


def probe_dir(path: Path) -> Path:
    path.mkdir()
    return path


def test_opposite_completion_orders_give_identical_bytes(tmp_path: Path) -> None:
    outs = []
    for order in ("asc", "desc"):
        root = probe_dir(tmp_path / order)
        proc = dispatch(write_pack(root), root / "st", "-j", "3", ACC_ORDER=order)
        assert proc.returncode == 0, proc.stderr
        bundle = root / "bundle"
        assert prove(root / "st", bundle).returncode == 0
        outs.append(
            (
                (root / "st" / "operations.ndjson").read_bytes(),
                (bundle / "admission-proof.json").read_bytes(),
                (bundle / "execution.json").read_bytes(),
            )
        )
    assert outs[0] == outs[1]


def test_a_refused_selection_starts_no_child(tmp_path: Path) -> None:
    state = tmp_path / "st"
    proc = dispatch(write_pack(tmp_path, max_instances=3), state)
    assert proc.returncode == 1
    recs = records(state, "people")
    assert {r["note"] for r in recs.values()} == {"refused: would exceed max_instances by 1"}
    assert not (state / "work" / "people").exists() or not any(
        (state / "work" / "people").iterdir()
    )
    select = [o for o in ops(state) if o["op"] == "select"]
    assert len(select) == 1 and [o["op"] for o in ops(state)][-1] == "select"
    bundle = tmp_path / "bundle"
    assert prove(state, bundle).returncode == 0
    assert verify(bundle).returncode == 0
    assert json.loads((bundle / "selections" / "org" / "1.json").read_text())["refusal"] == (
        "limit-exceeded"
    )


def test_sigterm_then_resume_still_verifies(tmp_path: Path) -> None:
    pack, state = write_pack(tmp_path), tmp_path / "st"
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        [DISPATCH, str(pack), "--state", str(state), "--actor", "tester", "-j", "3"],
        env=env(ACC_GATE=str(gate)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        log = state / "operations.ndjson"
        while time.monotonic() < deadline:
            if log.is_file() and b'"op":"select"' in log.read_bytes():
                break
            time.sleep(0.05)
        time.sleep(0.5)  # the children have started and wait at the gate
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert [o["op"] for o in ops(state)][-1] == "recover"
    gate.touch()
    resumed = dispatch(pack, state, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    kinds = [o["op"] for o in ops(state)]
    assert kinds.count("retry") == 3
    assert all(
        o["actor"] == "tester" and o["at"] == "2023-11-14T22:13:20Z"
        for o in ops(state)
        if o["op"] == "retry"
    )
    bundle = tmp_path / "bundle"
    made = prove(state, bundle)
    assert made.returncode == 0, made.stderr
    assert verify(bundle).returncode == 0


@pytest.mark.parametrize("actor", ["a\x01b", "tab\there", ""])
def test_a_bad_actor_is_one_line_exit_2_and_nothing_written(tmp_path: Path, actor: str) -> None:
    pack, state = write_pack(tmp_path), tmp_path / "st"
    proc = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "--actor", actor],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--actor" in proc.stderr
    assert not state.exists()


def test_retry_failed_is_an_explicit_retry_epoch(tmp_path: Path) -> None:
    pack, state = write_pack(tmp_path), tmp_path / "st"
    first = dispatch(pack, state, ACC_FAIL="globex")
    assert first.returncode == 1
    failed = [o for o in ops(state) if o["op"] == "observe" and o["state"] == "failed"]
    assert [(o["instance"], o["failure"]) for o in failed] == [("people.1", "evaluation-error")]
    again = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "--resume", "--retry-failed"],
        capture_output=True,
        text=True,
        env={**env(), "LOGNAME": "operator"},
        check=False,
    )
    assert again.returncode == 0, again.stderr
    retries = [o for o in ops(state) if o["op"] == "retry"]
    # the actor defaults to the login name; at honours SOURCE_DATE_EPOCH
    assert retries == [
        {"op": "retry", "instance": "people.1", "actor": "operator", "at": "2023-11-14T22:13:20Z"}
    ]
    last = ops(state)[-1]
    assert (last["instance"], last["attempt"], last["state"]) == ("people.1", 2, "evaluated")
    bundle = tmp_path / "bundle"
    assert prove(state, bundle).returncode == 0
    assert verify(bundle).returncode == 0


def test_recording_unavailable_stops_the_run_with_exit_3(tmp_path: Path) -> None:
    """A selection admitted at exactly max_bytes leaves no room to begin its group:
    the begin is a mandatory record (RFC 0024 §8), so the run stops, exit 3."""
    probe = probe_dir(tmp_path / "probe")
    assert dispatch(write_pack(probe, max_bytes=99999), probe / "st").returncode == 0
    st = probe / "st"
    result = prove_lib(
        ProveOptions(
            st / "workflow.json",
            st / "operations.ndjson",
            st / "proof" / "artifacts",
            probe / "bundle",
            durable=False,
        )
    )
    (selection,) = [d for d in result.decisions if d.kind == "selection"]
    assert selection.acceptance is not None
    at = selection.acceptance[0]
    run = probe_dir(tmp_path / "run")
    proc = dispatch(write_pack(run, max_bytes=at), run / "st")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "recording unavailable" in lines[0], proc.stderr
    assert [o["op"] for o in ops(run / "st")][-2:] == ["select", "group"]
    assert not (run / "st" / "work" / "people").exists()
    made = prove(run / "st", tmp_path / "bundle")
    assert made.returncode == 3  # the writer decides the same: the last complete prefix
    partial = json.loads((tmp_path / "bundle" / "partial.json").read_text())
    assert partial["reason"] == "recording-unavailable"
    assert verify(tmp_path / "bundle").returncode == 0


def test_the_operation_log_matches_its_schema(tmp_path: Path) -> None:
    schema = json.loads((Path(__file__).parents[2] / "docs/schemas/operation.json").read_text())
    state = tmp_path / "st"
    assert dispatch(write_pack(tmp_path), state, ACC_FAIL="acme").returncode == 1
    for op in ops(state):
        jsonschema.validate(op, schema)


def test_cache_is_refused_for_an_accounted_plan(tmp_path: Path) -> None:
    pack, state = write_pack(tmp_path), tmp_path / "st"
    proc = dispatch(pack, state, "--cache", str(tmp_path / "cache"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "accounted plan" in proc.stderr
    # refused before the run claimed the state dir (its lock, as for any such refusal)
    assert not state.exists() or [p.name for p in state.iterdir()] == ["lock"]


def test_a_session_that_ended_before_its_group_begins_it_on_resume(tmp_path: Path) -> None:
    """Reserved children never begun (the log ends at the selection, as after a crash
    between the two lines): the resume begins their group, not retries."""
    pack, state = write_pack(tmp_path), tmp_path / "st"
    assert dispatch(pack, state).returncode == 0
    lines = (state / "operations.ndjson").read_bytes().splitlines(keepends=True)
    kinds = [json.loads(line)["op"] for line in lines]
    cut = kinds.index("select") + 1
    (state / "operations.ndjson").write_bytes(b"".join(lines[:cut]))
    (state / "results" / "people.jsonl").unlink()
    (state / "results" / "people.json").unlink(missing_ok=True)
    resumed = dispatch(pack, state, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    after = [o["op"] for o in ops(state)]
    assert after[cut:] == ["group", "observe", "observe", "observe"]
    bundle = tmp_path / "bundle"
    assert prove(state, bundle).returncode == 0
    assert verify(bundle).returncode == 0


def test_two_consumers_are_reserved_by_one_selection(tmp_path: Path) -> None:
    """Both tasks mapping over the root are the root stage's direct consumers: one
    selection reserves every child of both, in workflow order (RFC 0024 §3)."""
    text = PACK.replace("ORGS", ORGS).replace("MAX_BYTES", "99999").replace("MAX_INSTANCES", "64")
    text += """
[[workflow.task]]
name = "sites"
needs = ["org"]
map = "org.orgs"
key = "name"
run = '''printf '{"site": 1}' > "$CRUCIBLE_OUTPUT"'''
"""
    pack, state = tmp_path / "pack.toml", tmp_path / "st"
    pack.write_text(text)
    proc = dispatch(pack, state)
    assert proc.returncode == 0, proc.stderr
    (select,) = [o for o in ops(state) if o["op"] == "select"]
    assert select["childIds"] == [
        "people.0",
        "people.1",
        "people.2",
        "sites.acme",
        "sites.globex",
        "sites.initech",
    ]
    groups = [o for o in ops(state) if o["op"] == "group"]
    assert len(groups) == 2 and len(groups[1]["starts"]) == 6
    bundle = tmp_path / "bundle"
    assert prove(state, bundle).returncode == 0
    assert verify(bundle).returncode == 0


def test_a_refused_root_output_is_never_staged_downstream(tmp_path: Path) -> None:
    probe = probe_dir(tmp_path / "probe")
    dispatch(write_pack(probe, max_bytes=9999), probe / "st")
    st = probe / "st"
    result = prove_lib(
        ProveOptions(
            st / "workflow.json",
            st / "operations.ndjson",
            st / "proof" / "artifacts",
            probe / "bundle",
            durable=False,
        )
    )
    root = next(d for d in result.decisions if d.kind == "observation")
    assert root.outcome == "accepted" and root.acceptance is not None
    limit = root.acceptance[0] - 1
    assert 1000 <= limit <= 9999  # the same number of digits as the probe's bound
    run = probe_dir(tmp_path / "run")
    proc = dispatch(write_pack(run, max_bytes=limit), run / "st")
    assert proc.returncode == 1
    org = json.loads((run / "st" / "results" / "org.json").read_text())
    assert org["status"] == "failed"
    assert org["note"] == "refused: would exceed max_bytes by 1"
    people = json.loads((run / "st" / "results" / "people.json").read_text())
    assert people["status"] == "skipped"
    assert [o["op"] for o in ops(run / "st")] == ["root", "group", "observe"]
    assert not (run / "st" / "work" / "people").exists()
    bundle = tmp_path / "bundle"
    assert prove(run / "st", bundle).returncode == 0
    assert verify(bundle).returncode == 0


def test_workflow_json_is_the_record_the_plan_carries() -> None:
    """STATE/workflow.json is written from the plan's model: the bytes the
    plan's own workflow members give (its digest is what a verifier pins)."""
    repo = Path(__file__).resolve().parents[2]
    raw = canon.loads((repo / "tests/compile/packs/accounted/golden.plan.json").read_bytes())
    wf = raw["workflow"]
    expected = {
        "workflowVersion": 2,
        "name": wf["name"],
        "limits": camel_limits(wf["limits"]),
        "stages": wf["record"],
    }
    assert workflow_document(Plan.from_json(raw, checked=True)) == canon.dumps(expected)
