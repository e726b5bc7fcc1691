"""From each valid bundle, many kinds of mutation, each with its specific code and phase.

Covers every item of RFC 0024's Conformance list that a reader can check (see
docs/spec/verify.md, "Conformance coverage"). Valid bundles: the spec-built ones
of bundlegen.py and every recorded vector under tests/vectors/proof/.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon, digest
from crucible.proof.reader import VerifyOptions, verify_bundle
from tests.proof.reader.bundlegen import org_people, rich
from tests.proof.reader.mutate import EXEC, PROOF, Bundle, attempt_file, load_dir, write_dir

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "proof"

Result = tuple[dict[str, bytes], str, int] | None
MUTATIONS: dict[str, Callable[[Bundle], Result]] = {}


def mutation(fn: Callable[[Bundle], Result]) -> Callable[[Bundle], Result]:
    MUTATIONS[fn.__name__] = fn
    return fn


def _valid_bundles() -> dict[str, dict[str, bytes]]:
    out = {"gen-org-people": org_people().exported(), "gen-rich": rich().exported()}
    if VECTORS.is_dir():
        from tests.proof.reader.test_verify_vectors import DISAGREEMENTS

        for case in sorted(VECTORS.iterdir()):
            expected = case / "expected.json"
            if not expected.is_file() or case.name in DISAGREEMENTS:
                continue
            if canon.loads(expected.read_bytes())["reader"]["outcome"] == "reading":
                out[f"vector-{case.name}"] = load_dir(case / "bundle")
    return out


VALID = _valid_bundles()


# ---------------------------------------------------------------- phase 1


@mutation
def proof_over_8mib(b: Bundle) -> Result:
    b.files[PROOF] = b.files[PROOF] + b" " * (8 * 1024 * 1024 + 1 - len(b.files[PROOF]))
    return b.files, "input-over-bound", 1


@mutation
def deep_nesting(b: Bundle) -> Result:
    b.files["root-case.json"] = b"[" * 5000 + b"]" * 5000
    return b.files, "input-over-bound", 1


@mutation
def nesting_65(b: Bundle) -> Result:
    v: Any = 1
    for _ in range(70):
        v = [v]
    b.files[EXEC] = canon.dumps({**b.execution, "instances": [v]})
    return b.files, "input-over-bound", 1


@mutation
def duplicate_keys(b: Bundle) -> Result:
    data = b.files[EXEC]
    b.files[EXEC] = b'{"execution":"x",' + data[1:]
    return b.files, "input-malformed", 1


@mutation
def non_canonical_bytes(b: Bundle) -> Result:
    b.files["workflow.json"] = b.files["workflow.json"].replace(b":", b": ", 1)
    return b.files, "input-malformed", 1


@mutation
def integer_out_of_domain(b: Bundle) -> Result:
    b.files[EXEC] = b.files[EXEC].replace(
        b'"executionVersion":2', b'"executionVersion":9007199254740993'
    )
    return b.files, "input-malformed", 1


@mutation
def symlink_inside(b: Bundle) -> Result:
    b.files["__symlink__:sets/evil.json"] = b"/etc/passwd"
    return b.files, "input-malformed", 1


@mutation
def workflow_version_1(b: Bundle) -> Result:
    wf = b.json("workflow.json")
    wf["workflowVersion"] = 1
    b.put("workflow.json", wf)
    return b.files, "version-unread", 1


@mutation
def run_export_version_4(b: Bundle) -> Result:
    if (o := b.first_evaluated()) is None:
        return None
    path = attempt_file(o, "run.json")
    run = canon.loads(b.files[path])
    run["exportVersion"] = 4
    b.repin_file(o, "runDigest", canon.dumps(run))
    return b.finish(), "version-unread", 1


@mutation
def missing_pinned_artifact(b: Bundle) -> Result:
    if (o := b.first_evaluated()) is None:
        return None
    del b.files[attempt_file(o, "audit.json")]
    return b.files, "inventory-mismatch", 1


@mutation
def unknown_epoch_kind(b: Bundle) -> Result:
    b.epochs[-1]["kind"] = "merge"
    return b.finish(), "kind-unread", 1


@mutation
def unknown_epoch_member(b: Bundle) -> Result:
    b.epochs[-1]["byteTotal"] = 123
    return b.finish(), "input-malformed", 1


@mutation
def thirty_three_blocks(b: Bundle) -> Result:
    p = dict(b.proof)
    p["epochBlocks"] = [[b.epochs[0]]] * 33
    b.files[PROOF] = canon.dumps(p)
    return b.files, "input-over-bound", 1


@mutation
def block_of_4097(b: Bundle) -> Result:
    p = dict(b.proof)
    p["epochBlocks"] = [[b.epochs[0]] * 4097]
    b.files[PROOF] = canon.dumps(p)
    return b.files, "input-over-bound", 1


@mutation
def huge_id(b: Bundle) -> Result:
    p = dict(b.proof)
    p["rootInstance"] = "r" * 100_000
    b.files[PROOF] = canon.dumps(p)
    return b.files, "input-over-bound", 1


@mutation
def finalization_overflow(b: Bundle) -> Result:
    wf = b.json("workflow.json")
    room = wf["limits"]["maxBytes"] - sum(len(v) for k, v in b.files.items() if k != "partial.json")
    if room > 8 * 1024 * 1024:
        return None
    b.files["aux/padding.bin"] = b"x" * (room + 1)
    return b.files, "input-over-bound", 1


@mutation
def bad_finished_at(b: Bundle) -> Result:
    for _, _, o in b.observations():
        if o["failure"] == "preparation-failed" or (
            o["failure"] == "admission-refused" and o["preparationDigest"] is None
        ):
            path = attempt_file(o, "run.json")
            run = canon.loads(b.files[path])
            run["finishedAt"] = "2026-10-17T09:00:00.5Z"
            b.repin_file(o, "runDigest", canon.dumps(run))
            return b.finish(), "input-malformed", 1
    return None


# ---------------------------------------------------------------- phase 2


@mutation
def edited_audit_not_repinned(b: Bundle) -> Result:
    if (o := b.first_evaluated()) is None:
        return None
    path = attempt_file(o, "preparation.json")
    b.files[path] = canon.dumps({"forged": True})
    return b.files, "digest-mismatch", 2


@mutation
def wrong_sidecar(b: Bundle) -> Result:
    b.files["admission-proof.digest"] = (digest.of_bytes(b"x") + "\n").encode()
    return b.files, "digest-mismatch", 2


@mutation
def broken_chain_link(b: Bundle) -> Result:
    b.epochs[-1]["previousProofDigest"] = digest.of_bytes(b"elsewhere")
    return b.finish(repin_chain=False), "digest-mismatch", 2


@mutation
def frozen_stage_repinned(b: Bundle) -> Result:
    wf = b.json("workflow.json")
    s = wf["stages"][-1]
    path = f"frozen/{s['name']}.json"
    forged = {**s, "output": {**s["output"], "pointer": "/forged"}}
    b.put(path, forged)
    frozen = [
        {"stage": x["name"], "digest": digest.of_bytes(b.files[f"frozen/{x['name']}.json"])}
        for x in wf["stages"]
    ]
    b.proof["frozenDigest"] = digest.of_json(frozen)
    b.execution["frozen"] = frozen
    return b.finish(), "stage-binding-mismatch", 2


# ---------------------------------------------------------------- phase 3


@mutation
def evaluated_without_preparation(b: Bundle) -> Result:
    if (o := b.first_evaluated()) is None:
        return None
    b.repin_file(o, "preparationDigest", None)
    return b.finish(), "preparation-mismatch", 3


# ---------------------------------------------------------------- phase 4


def _selection_epoch(b: Bundle) -> dict[str, Any] | None:
    return next((e for e in b.epochs if e["kind"] in ("selection", "fork") and e["childIds"]), None)


@mutation
def offered_digest_forged(b: Bundle) -> Result:
    e = _selection_epoch(b)
    if e is None:
        return None
    path = f"selections/{e['stage']}/{e['revision']}.json"
    sel = b.json(path)
    sel["offeredDigest"] = digest.of_bytes(b"another offered set")
    b.put(path, sel)
    core = {k: v for k, v in sel.items() if k != "refusal"}
    e["selectionCoreDigest"] = digest.of_json(core)
    for st in b.execution["stages"]:
        if (
            st["stage"] == e["stage"]
            and st["selection"]
            and st["selection"]["revision"] == e["revision"]
        ):
            st["selection"]["digest"] = digest.of_bytes(b.files[path])
    return b.finish(), "selection-mismatch", 4


@mutation
def case_edited(b: Bundle) -> Result:
    e = _selection_epoch(b)
    if e is None:
        return None
    for cid in e["childIds"]:
        path = f"instances/{cid}/case.json"
        if path in b.files:
            case = b.json(path)
            case["input"] = {"forged": True}
            b.put(path, case)
            return b.finish(), "case-mismatch", 4
    return None


@mutation
def start_admission_refused_slot(b: Bundle) -> Result:
    for inst in b.execution["instances"]:
        if inst["failure"] == "admission-refused" and not inst["attempts"]:
            group = next(
                e
                for e in b.epochs
                if (e["kind"] == "group" and e["results"] == []) or e["kind"] == "group"
            )
            groups = [e for e in b.epochs if e["kind"] == "group"]
            group = groups[-1]
            group["deferred"] = sorted(group["deferred"] + [inst["id"]])
            return b.finish(), "influence-mismatch", 4
    return None


@mutation
def repeated_child_id(b: Bundle) -> Result:
    e = _selection_epoch(b)
    if e is None or len(e["childIds"]) < 2:
        return None
    e["childIds"][1] = e["childIds"][0]
    return b.finish(), "inventory-mismatch", 4


@mutation
def omitted_child(b: Bundle) -> Result:
    e = _selection_epoch(b)
    if e is None:
        return None
    e["childIds"] = e["childIds"][:-1]
    return b.finish(), "inventory-mismatch", 4


@mutation
def inserted_epoch(b: Bundle) -> Result:
    groups = [i for i, e in enumerate(b.epochs) if e["kind"] == "group"]
    if not groups:
        return None
    i = groups[0]
    b.epochs.insert(i + 1, canon.loads(canon.dumps(b.epochs[i])))
    return b.finish(), "inventory-mismatch", 4


def _group_before_selection(b: Bundle) -> int | None:
    for i in range(1, len(b.epochs) - 1):
        if b.epochs[i]["kind"] == "group" and b.epochs[i + 1]["kind"] in ("selection", "fork"):
            return i
    return None


@mutation
def omitted_epoch(b: Bundle) -> Result:
    """Drop the group that produced a stage's outputs: the later selection's offered set
    no longer exists at its prefix."""
    i = _group_before_selection(b)
    if i is None:
        return None
    del b.epochs[i]
    for e in b.epochs[i:]:  # a careful forger renumbers the references too
        if e["kind"] == "group" and e["reservation"] > i:
            e["reservation"] -= 1
    return b.finish(), "selection-mismatch", 4


@mutation
def reordered_epochs(b: Bundle) -> Result:
    """Swap a group and the selection of its outputs: selection before evaluation."""
    i = _group_before_selection(b)
    if i is None:
        return None
    b.epochs[i], b.epochs[i + 1] = b.epochs[i + 1], b.epochs[i]
    return b.finish(), "selection-mismatch", 4


@mutation
def reordered_epochs_later_reference(b: Bundle) -> Result:
    """Swap a selection and the group over its reservation: a reference to a later epoch."""
    for i in range(1, len(b.epochs) - 1):
        e, nxt = b.epochs[i], b.epochs[i + 1]
        if (
            e["kind"] in ("selection", "fork")
            and nxt["kind"] == "group"
            and nxt["reservation"] == e["number"]
        ):
            b.epochs[i], b.epochs[i + 1] = nxt, e
            return b.finish(), "input-malformed", 1
    return None


@mutation
def attempt_assigned_twice(b: Bundle) -> Result:
    groups = [e for e in b.epochs if e["kind"] == "group" and e["starts"]]
    last = b.epochs[-1]
    if not groups or len(last.get("results", [])) < len(last.get("starts", [last.get("begin")])):
        return None  # after an open epoch nothing may follow at all (a form refusal)
    g = groups[0]
    again = {
        "kind": "group",
        "reservation": g["reservation"],
        "starts": [g["starts"][0]],
        "deferred": [],
        "cancelled": [],
        "results": [g["results"][0]] if g["results"] else [],
        "number": 0,
        "previousProofDigest": "",
    }
    b.epochs.append(again)
    return b.finish(), "inventory-mismatch", 4


@mutation
def observation_moved_earlier(b: Bundle) -> Result:
    groups = [e for e in b.epochs if e["kind"] == "group" and len(e["results"]) >= 1]
    if len(groups) < 2:
        return None
    first, later = groups[0], groups[1]
    # the attempt moves whole (its begin and its observation) to an earlier epoch
    first["starts"].append(later["starts"].pop(0))
    first["results"].append(later["results"].pop(0))
    return b.finish(), "inventory-mismatch", 4


@mutation
def signature_of_another_attempt(b: Bundle) -> Result:
    sigs = [(e, j, o) for e, j, o in b.observations() if o["auditSignaturesDigest"] is not None]
    if len(sigs) >= 2:
        (_, _, a), (_, _, bb) = sigs[0], sigs[1]
        data = b.files[f"instances/{a['instance']}/attempts/{a['number']}/audit.sig"]
        b.repin_file(bb, "auditSignaturesDigest", data)
        return b.finish(), "inventory-mismatch", 4
    return None


@mutation
def equal_audit_with_other_signature(b: Bundle) -> Result:
    sigs = [o for _, _, o in b.observations() if o["auditSignaturesDigest"] is not None]
    if len(sigs) < 2:
        return None
    a, other = sigs[0], sigs[1]
    pa = f"instances/{a['instance']}/attempts/{a['number']}/"
    b.repin_file(other, "auditDigest", b.files[pa + "audit.json"])
    b.repin_file(other, "auditSignaturesDigest", b.files[pa + "audit.sig"])
    return b.finish(), "inventory-mismatch", 4


@mutation
def false_refusal(b: Bundle) -> Result:
    """Mark the last accepted proposal refused: drop its outputs, claim limit-exceeded."""
    for _e, _, o in reversed(list(b.observations())):
        if o["state"] != "evaluated":
            continue
        prefix = None
        for inst in b.execution["instances"]:
            if inst["id"] == o["instance"]:
                a = inst["attempts"][o["number"] - 1]
                if a["state"] == "completed":
                    prefix = f"outputs/{inst['stage']}/{inst['id']}/{o['number']}/"
                    a["state"], a["failure"] = "failed", "limit-exceeded"
                    inst["state"], inst["failure"] = "failed", "limit-exceeded"
        if prefix is None:
            continue
        for p in [p for p in b.files if p.startswith(prefix)]:
            del b.files[p]
        stage = prefix.split("/")[1]
        s = b.json(f"sets/{stage}.json")
        s["records"] = [
            r
            for r in s["records"]
            if not (r["instance"] == o["instance"] and r["attempt"] == o["number"])
        ]
        b.put(f"sets/{stage}.json", s)
        return b.finish(), "output-mismatch", 4
    return None


@mutation
def payload_edited(b: Bundle) -> Result:
    for p in sorted(b.files):
        if p.startswith("outputs/") and p.endswith(".payload.json"):
            b.put(p, {"forged": 1})
            return b.files, "output-mismatch", 4
    return None


# ---------------------------------------------------------------- phase 5


@mutation
def extra_file(b: Bundle) -> Result:
    b.files["instances/ghost/case.json"] = canon.dumps({"ghost": 1})
    return b.files, "inventory-mismatch", 5


@mutation
def execution_state_forged(b: Bundle) -> Result:
    inst = b.execution["instances"][-1]
    inst["state"] = "completed" if inst["state"] != "completed" else "interrupted"
    b.files[EXEC] = canon.dumps(b.execution)
    return b.files, "inventory-mismatch", 5


@mutation
def set_record_dropped(b: Bundle) -> Result:
    for p in sorted(b.files):
        if p.startswith("sets/"):
            s = b.json(p)
            if s["records"]:
                s["records"] = s["records"][1:]
                b.put(p, s)
                return b.files, "inventory-mismatch", 5
    return None


def _run(tmp: Path, files: dict[str, bytes], options: VerifyOptions | None = None) -> Any:
    root = tmp / "bundle"
    plain = {k: v for k, v in files.items() if not k.startswith("__symlink__:")}
    write_dir(root, plain)
    for k, v in files.items():
        if k.startswith("__symlink__:"):
            os.symlink(v.decode(), root / k.split(":", 1)[1])
    return verify_bundle(root, options)


def _over_supplied_bound(files: dict[str, bytes]) -> bool:
    try:
        wf = canon.loads(files["workflow.json"])
        if canon.dumps(wf) != files["workflow.json"] or wf.get("workflowVersion") != 2:
            return False
        limits = wf["limits"]
    except (canon.CanonError, KeyError, TypeError):
        return False
    plain = [
        v for k, v in files.items() if not k.startswith("__symlink__:") and k != "partial.json"
    ]
    return bool(sum(len(v) for v in plain) > limits["maxBytes"] or len(plain) > limits["maxFiles"])


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_bundle_reads(tmp_path: Path, name: str) -> None:
    report = _run(tmp_path, VALID[name])
    assert report.problem is None, str(report.problem)


def _applicable() -> list[tuple[str, str]]:
    """(bundle, mutation) pairs where the mutation applies (e.g. needs a signature)."""
    return [
        (name, m)
        for name in sorted(VALID)
        for m, fn in sorted(MUTATIONS.items())
        if fn(Bundle(VALID[name])) is not None
    ]


APPLICABLE = _applicable()


@pytest.mark.parametrize(("name", "mutation_name"), APPLICABLE)
def test_mutation(tmp_path: Path, name: str, mutation_name: str) -> None:
    result = MUTATIONS[mutation_name](Bundle(VALID[name]))
    assert result is not None
    files, code, phase = result
    if _over_supplied_bound(files):
        # the mutation pushed a tight base bundle over its own maxBytes/maxFiles: that
        # supplied bound is the senior phase-1 refusal (RFC 0024 §8)
        code, phase = "input-over-bound", 1
    report = _run(tmp_path, files)
    assert report.problem is not None, f"{mutation_name}: the mutated bundle still reads"
    assert (report.problem.code, report.problem.phase) == (code, phase), str(report.problem)


def test_at_least_twenty_kinds_apply_to_each_bundle() -> None:
    for name in VALID:
        kinds = [m for n, m in APPLICABLE if n == name]
        assert len(kinds) >= 20, (name, kinds)


def test_every_mutation_kind_is_exercised() -> None:
    assert {m for _, m in APPLICABLE} == set(MUTATIONS)


@pytest.mark.parametrize("name", sorted(VALID))
def test_expect_pins(tmp_path: Path, name: str) -> None:
    files = VALID[name]
    pd = digest.of_bytes(files[PROOF])
    ok = _run(tmp_path / "a", files, VerifyOptions(expect={"admissionProofDigest": pd}))
    assert ok.problem is None
    b = Bundle(files)
    b.epochs.pop()  # a consistent, repinned, shorter history: only the held pin disagrees
    bad = _run(tmp_path / "b", b.finish(), VerifyOptions(expect={"admissionProofDigest": pd}))
    assert bad.problem is not None and (bad.problem.code, bad.problem.phase) == (
        "digest-mismatch",
        2,
    )
