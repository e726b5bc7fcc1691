"""The writer's rules (docs/spec/admission-proof.md §5-§9), through the library."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon, digest
from crucible.core.errors import InputRefused, OperationalError, ParseError
from crucible.proof.writer import Forbidden
from tests.proof.writer.prove_helpers import (
    Scenario,
    check_chain,
    evaluated_root,
    people,
    proof_epochs,
    read_tree,
    two_children,
)


def execution(bundle: Path) -> dict[str, Any]:
    return canon.loads((bundle / "execution.json").read_bytes())  # type: ignore[no-any-return]


def instance(bundle: Path, iid: str) -> dict[str, Any]:
    return next(i for i in execution(bundle)["instances"] if i["id"] == iid)


def test_complete_run_bundle_is_the_measured_candidate(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.evaluated("a", 1, people("Ann"))
    s.evaluated("b", 1, people("Bob", "Bea"))
    s.finish()
    result = s.prove()
    bundle = tmp_path / "bundle"
    files = read_tree(bundle)
    assert result.partial is None and result.unrecordable is None
    assert result.bytes == sum(len(b) for b in files.values())
    assert result.files == len(files)
    assert result.decisions[-1].acceptance == (result.bytes, result.files)
    check_chain(bundle)
    ex = execution(bundle)
    assert [i["id"] for i in ex["instances"]] == ["r", "a", "b"]
    assert [i["state"] for i in ex["instances"]] == ["completed"] * 3
    sets = canon.loads(files["sets/people.json"])
    assert [(r["instance"], r["output"]) for r in sets["records"]] == [("a", 0), ("b", 0), ("b", 1)]
    # every canonical JSON file in the bundle is canonical; pins match the files
    for rel, data in files.items():
        if rel.endswith(".json") and "/attempts/" not in rel:
            assert canon.dumps(canon.loads(data)) == data, rel
    att = instance(bundle, "a")["attempts"][0]
    assert att["auditDigest"] == digest.of_bytes(files["instances/a/attempts/1/audit.json"])
    env = canon.loads(files["outputs/people/b/1/1.envelope.json"])
    assert env["payloadDigest"] == digest.of_bytes(files["outputs/people/b/1/1.payload.json"])
    assert env["parent"] == {"instance": "r", "output": 1}
    case = canon.loads(files["instances/a/case.json"])
    assert case == {
        "caseVersion": 1,
        "stage": "people",
        "instance": "a",
        "parent": {"instance": "r", "output": 0},
        "input": {"name": "Acme"},
    }


def test_results_follow_starts_order_whatever_the_arrival_order(tmp_path: Path) -> None:
    bundles = []
    for order in (("a", "b"), ("b", "a")):
        s = Scenario(tmp_path / "".join(order), limits={"maxRecords": 2 + 10})
        two_children(s)
        for iid in order:
            s.evaluated(iid, 1, people(*[f"{iid}{k}" for k in range(6)]), tag="")
        s.finish()
        result = s.prove()
        outcomes = [d.outcome for d in result.decisions if d.kind == "observation"]
        assert outcomes[-2:] == ["accepted", "refused"]
        bundles.append(read_tree(tmp_path / "".join(order) / "bundle"))
    assert bundles[0] == bundles[1]
    b = tmp_path / "ab" / "bundle"
    assert instance(b, "a")["state"] == "completed"
    assert (instance(b, "b")["state"], instance(b, "b")["failure"]) == ("failed", "limit-exceeded")
    _, epochs = proof_epochs(b)
    assert [r["instance"] for r in epochs[3]["results"]] == ["a", "b"]


def fixed_point(build: Any, pick: Any) -> int:
    m = 1_000_000
    for _ in range(10):
        size = pick(build(m))
        if size == m:
            return m
        m = size
    raise AssertionError("no fixed point")


def test_byte_boundary_equality_fits_one_less_refuses_with_fitting_carrier(tmp_path: Path) -> None:
    def build(max_bytes: int, where: str = "x") -> Any:
        s = Scenario(tmp_path / where, limits={"maxBytes": max_bytes})
        two_children(s)
        s.evaluated("a", 1, people("Ann"))
        return s.prove()

    m = fixed_point(build, lambda r: r.decisions[-1].acceptance[0])
    at = build(m, "at").decisions[-1]
    assert at.outcome == "accepted" and at.acceptance[0] == m
    below = build(m - 1, "below").decisions[-1]
    assert below.outcome == "refused"
    assert below.acceptance[0] == m  # same candidate, one byte over
    assert below.refusal is not None and below.refusal[0] <= m - 1
    bundle = tmp_path / "below" / "bundle"
    assert not (bundle / "outputs" / "people").exists()
    assert instance(bundle, "a")["attempts"][0]["auditDigest"] is not None  # material retained


def test_cutoff_suppresses_later_valid_proposals_in_the_same_epoch(tmp_path: Path) -> None:
    s = Scenario(tmp_path, limits={"maxRecords": 2 + 1})
    evaluated_root(s, "Acme", "Globex", "Initech")
    s.select("org", [("r", 0), ("r", 1), ("r", 2)], ["a", "b", "c"])
    s.group(3, ["a", "b", "c"])
    s.evaluated("a", 1, people("A1", "A2"))  # refused: 3 + 2 > 3 + ... (records 3 retained)
    s.evaluated("b", 1, people())  # valid zero proposal but cut off
    s.observe("c", 1, "suppressed")
    s.finish()
    result = s.prove()
    outcomes = [d.outcome for d in result.decisions if d.kind == "observation"][-3:]
    assert outcomes == ["refused", "cut-off", "recorded"]
    b = tmp_path / "bundle"
    for iid in "abc":
        assert (instance(b, iid)["state"], instance(b, iid)["failure"]) == (
            "failed",
            "limit-exceeded",
        )


def test_suppressed_without_cutoff_is_forbidden(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.observe("a", 1, "suppressed")
    with pytest.raises(Forbidden, match="cutoff"):
        s.prove()


def test_earlier_sibling_retry_after_later_refusal(tmp_path: Path) -> None:
    def build(where: str, retry: bool) -> Any:
        s = Scenario(tmp_path / where, limits={"maxRecords": 2 + 1})
        two_children(s)
        s.failed("a", 1)
        s.evaluated("b", 1, people("B1", "B2"))  # 2 + 2 > 3: refused
        if retry:
            s.retry("a")
            s.evaluated("a", 2, people("A1"))
        s.finish()
        return s.prove()

    before = build("before", retry=False)
    after = build("after", retry=True)
    b0, b1 = tmp_path / "before" / "bundle", tmp_path / "after" / "bundle"
    _, e0 = proof_epochs(b0)
    _, e1 = proof_epochs(b1)
    assert e1[: len(e0)] == e0  # B's epoch and every earlier one unchanged
    assert e1[-1]["kind"] == "retry"
    assert e1[-1]["previousProofDigest"] == before.proof_digest
    assert (instance(b1, "b")["state"], instance(b1, "b")["failure"]) == (
        "failed",
        "limit-exceeded",
    )
    assert instance(b1, "a")["state"] == "completed"
    assert instance(b1, "a")["attempts"][1]["retry"] == {
        "actor": "reviewer",
        "at": "2026-10-17T09:00:00Z",
    }
    assert after.decisions[-1].outcome == "accepted"


def test_retry_of_completed_or_cancelled_or_consumed_is_forbidden(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "completed")
    two_children(s)
    s.evaluated("a", 1, people("Ann"))
    s.evaluated("b", 1, people("Bob"))
    s.retry("a")
    with pytest.raises(Forbidden, match="completed instance is ineligible"):
        s.prove()
    s = Scenario(tmp_path / "root")
    evaluated_root(s, "Acme")
    s.select("org", [("r", 0)], ["a"])
    s.op(op="retry", instance="r", actor="x", at="2026-10-17T09:00:00Z")
    with pytest.raises(Forbidden, match="ineligible"):
        s.prove()
    s = Scenario(tmp_path / "attempts", limits={"maxAttempts": 1})
    two_children(s)
    s.failed("a", 1)
    s.evaluated("b", 1, people("Bob"))
    s.retry("a")
    with pytest.raises(Forbidden, match="maxAttempts"):
        s.prove()


def test_first_begin_in_consumed_stage_requires_fork(tmp_path: Path) -> None:
    stages = [
        {
            "name": "org",
            "input": {"fromStage": None, "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "/orgs", "cardinality": "many"},
        },
        {
            "name": "people",
            "input": {"fromStage": "org", "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "/people", "cardinality": "many"},
        },
        {
            "name": "bio",
            "input": {"fromStage": "people", "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "/bio", "cardinality": "one"},
        },
    ]

    def base(where: str) -> Scenario:
        s = Scenario(tmp_path / where, stages=stages)
        evaluated_root(s, "Acme", "Globex")
        s.select("org", [("r", 0), ("r", 1)], ["a", "b"])
        s.group(3, ["a"])  # b deferred
        s.evaluated("a", 1, people("Ann"))
        s.select("people", [("a", 0)], ["x"])  # consumes people's offered set
        return s

    s = base("forbidden")
    s.group(3, ["b"])
    with pytest.raises(Forbidden, match="requires the affected-stage fork"):
        s.prove()
    s = base("fork")
    s.select("org", [("r", 0), ("r", 1)], ["a2", "b2"], fork=True)
    s.group(6, ["b2"])
    s.finish()
    result = s.prove()
    bundle = tmp_path / "fork" / "bundle"
    ids = [i["id"] for i in execution(bundle)["instances"]]
    assert ids == ["r", "a2", "b2"]  # a, b and x retired
    files = read_tree(bundle)
    assert "instances/x/case.json" in files and "outputs/people/a/1/0.payload.json" in files
    ex = execution(bundle)
    assert [st["set"] for st in ex["stages"]] == ["closed", "closed", "blocked"]
    assert ex["stages"][0]["selection"]["revision"] == 2
    assert ex["stages"][1]["selection"] is None
    assert canon.loads(files["sets/bio.json"])["records"] == []
    assert result.partial == "open-epoch"


def test_reused_prospective_ids_are_forbidden_even_from_refused_selections(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "refused", limits={"maxCaseBytes": 60})
    evaluated_root(s, "Acme")
    s.select("org", [("r", 0)], ["a"])  # the projected case exceeds maxCaseBytes: refused
    s.select("org", [("r", 0)], ["a"])
    with pytest.raises(Forbidden, match="already proposed"):
        s.prove()
    s = Scenario(tmp_path / "root-id")
    evaluated_root(s, "Acme")
    s.select("org", [("r", 0)], ["r"])
    with pytest.raises(Forbidden, match="already proposed"):
        s.prove()


def test_local_case_bound_refuses_the_whole_selection(tmp_path: Path) -> None:
    s = Scenario(tmp_path, limits={"maxCaseBytes": 60})
    evaluated_root(s, "Acme")
    s.select("org", [("r", 0)], ["a"])
    s.select("org", [], [])  # revision 2, empty: admitted, consumers closed
    s.finish()
    result = s.prove()
    sel = [d for d in result.decisions if d.kind == "selection"]
    assert [d.outcome for d in sel] == ["refused", "admitted"]
    assert sel[0].acceptance is None  # a local refusal builds no aggregate candidate
    files = read_tree(tmp_path / "bundle")
    assert canon.loads(files["selections/org/1.json"])["refusal"] == "limit-exceeded"
    assert "refusal" not in canon.loads(files["selections/org/2.json"])
    assert "instances/a/case.json" not in files
    ex = execution(tmp_path / "bundle")
    assert ex["stages"][1]["set"] == "closed" and ex["stages"][0]["selection"]["revision"] == 2
    _, epochs = proof_epochs(tmp_path / "bundle")
    assert epochs[2]["childIds"] == ["a"] and epochs[3]["childIds"] == []
    core = canon.loads(files["selections/org/1.json"])
    del core["refusal"]
    assert epochs[2]["selectionCoreDigest"] == digest.of_json(core)


def test_count_refusal_records_null_child_ids(tmp_path: Path) -> None:
    s = Scenario(tmp_path, limits={"maxInstances": 2})
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], ["a", "b"])  # 1 + 2 > 2
    s.select("org", [("r", 1)], ["a"])  # count fits; "a" was never retained
    s.finish()
    result = s.prove()
    _, epochs = proof_epochs(tmp_path / "bundle")
    assert epochs[2]["childIds"] is None and epochs[3]["childIds"] == ["a"]
    assert [d.outcome for d in result.decisions if d.kind == "selection"] == ["refused", "admitted"]


def test_child_ids_required_when_count_fits(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    evaluated_root(s, "Acme")
    s.select("org", [("r", 0)], None)
    with pytest.raises(Forbidden, match="childIds must hold 1 ids"):
        s.prove()


def test_projection_and_admission_failures_are_reserved_slots(tmp_path: Path) -> None:
    stages = [
        {
            "name": "org",
            "input": {"fromStage": None, "fields": None, "admitMaxBytes": None},
            "output": {"pointer": "/orgs", "cardinality": "many"},
        },
        {
            "name": "people",
            "input": {"fromStage": "org", "fields": ["name"], "admitMaxBytes": 20},
            "output": {"pointer": "/people", "cardinality": "many"},
        },
    ]
    s = Scenario(tmp_path, stages=stages)
    s.root_op()
    s.group(1, ["r"])
    s.evaluated("r", 1, {"orgs": [{"name": "Acme"}, {"site": "x"}, {"name": "A" * 40}]})
    s.select("org", [("r", 0), ("r", 1), ("r", 2)], ["a", "b", "c"])
    s.group(3, ["a"])
    s.finish()
    s.prove()
    b = tmp_path / "bundle"
    assert (instance(b, "b")["state"], instance(b, "b")["failure"]) == (
        "failed",
        "projection-invalid",
    )
    assert instance(b, "b")["caseDigest"] is None
    assert (instance(b, "c")["state"], instance(b, "c")["failure"]) == (
        "failed",
        "admission-refused",
    )
    files = read_tree(b)
    assert "instances/c/case.json" in files and "instances/b/case.json" not in files
    _, epochs = proof_epochs(b)
    assert epochs[3]["deferred"] == [] and [x["instance"] for x in epochs[3]["starts"]] == ["a"]


def test_group_partition_rules(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "noop")
    two_children(s)
    s.ops[-1] = {"op": "group", "reservation": 3, "starts": [], "cancelled": []}
    with pytest.raises(Forbidden, match="non-empty"):
        s.prove()
    s = Scenario(tmp_path / "deferred")
    two_children(s)
    s.ops[-1] = {"op": "group", "reservation": 3, "starts": ["a"], "cancelled": [], "deferred": []}
    with pytest.raises(Forbidden, match="deferred must be exactly"):
        s.prove()
    s = Scenario(tmp_path / "cancel")
    two_children(s)
    s.ops[-1] = {
        "op": "group",
        "reservation": 3,
        "starts": ["b"],
        "cancelled": [{"instance": "a", "actor": "op", "at": "2026-10-17T09:00:00Z"}],
    }
    s.evaluated("b", 1, people("Bob"))
    s.finish()
    s.prove()
    b = tmp_path / "cancel" / "bundle"
    assert instance(b, "a")["state"] == "cancelled" and instance(b, "a")["attempts"] == []


def test_open_epoch_held_observation_goes_to_custody(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.evaluated("b", 1, people("Bob"))  # arrives first; a never arrives
    result = s.prove()
    assert result.partial == "no-finish" or result.partial == "open-epoch"
    assert result.partial == "open-epoch"
    b = tmp_path / "bundle"
    assert canon.loads((b / "partial.json").read_bytes())["reason"] == "open-epoch"
    custody = tmp_path / "bundle.custody"
    items = canon.loads((custody / "custody.json").read_bytes())["items"]
    assert [(i["instance"], i["reason"]) for i in items] == [("b", "pending")]
    assert all((custody / p).is_file() for p in items[0]["files"].values())
    assert "instances/b/attempts/1/audit.json" not in read_tree(b)
    check_chain(b)


def test_recover_processes_received_results_and_closes_the_rest(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.evaluated("b", 1, people("Bob"))  # held until a's turn
    s.op(op="recover")
    s.evaluated("a", 1, people("late"), tag="-late")  # a late response: custody
    s.retry("a")
    s.evaluated("a", 2, people("Ann"))
    s.finish()
    result = s.prove()
    b = tmp_path / "bundle"
    assert [a["state"] for a in instance(b, "a")["attempts"]] == ["interrupted", "completed"]
    assert instance(b, "b")["state"] == "completed"
    assert result.custody is not None
    items = canon.loads((result.custody / "custody.json").read_bytes())["items"]
    assert [(i["instance"], i["attempt"], i["reason"]) for i in items] == [("a", 1, "late")]


def test_cancel_after_received_evaluation_keeps_it_evaluated(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.evaluated("b", 1, people("Bob"))
    s.op(op="cancel")
    s.finish()
    s.prove()
    b = tmp_path / "bundle"
    assert instance(b, "a")["state"] == "cancelled" and instance(b, "b")["state"] == "completed"


def test_output_invalid_and_failure_states(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.evaluated("a", 1, {"people": "not an array"})
    s.failed("b", 1, "preparation-failed", with_run=True)
    s.finish()
    s.prove()
    b = tmp_path / "bundle"
    assert (instance(b, "a")["state"], instance(b, "a")["failure"]) == ("failed", "output-invalid")
    assert (instance(b, "b")["state"], instance(b, "b")["failure"]) == (
        "failed",
        "preparation-failed",
    )


@pytest.mark.parametrize(
    ("files", "state", "failure", "match"),
    [
        ({"audit": "x"}, "failed", "acquisition-failed", "cannot pin auditDigest"),
        ({}, "evaluated", None, "requires runDigest"),
        ({"preparation": "p.json"}, "interrupted", None, "requires a run pin"),
    ],
)
def test_pin_phase_table_violations(
    tmp_path: Path, files: dict[str, str], state: str, failure: str | None, match: str
) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.file("x", b"{}")
    s.file("p.json", b"{}")
    s.observe("a", 1, state, failure, files)
    with pytest.raises(InputRefused, match=match):
        s.prove()


def test_run_export_version_4_is_unread(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    rel = s.file("run4.json", {"exportVersion": 4, "finishedAt": None})
    s.observe("a", 1, "interrupted", None, {"run": rel})
    with pytest.raises(InputRefused, match="version-unread"):
        s.prove()


def test_refusal_carrier_that_cannot_fit_is_recording_unavailable(tmp_path: Path) -> None:
    s = Scenario(tmp_path, limits={"maxBytes": 8000})
    two_children(s)
    big = {"people": [{"name": "x" * 3000}]}
    s.evaluated("a", 1, big)  # the received audit alone overflows
    s.finish()
    result = s.prove()
    assert result.unrecordable is not None and "over the workflow limits" in result.unrecordable
    assert result.partial == "recording-unavailable"
    b = tmp_path / "bundle"
    assert canon.loads((b / "partial.json").read_bytes())["operationLine"] == 6
    assert "instances/a/attempts/1/audit.json" not in read_tree(b)
    items = canon.loads((tmp_path / "bundle.custody" / "custody.json").read_bytes())["items"]
    assert items[0]["reason"] == "unrecorded"
    check_chain(b)


def test_proof_ceiling_is_recording_unavailable(tmp_path: Path) -> None:
    from crucible.proof.writer import ProveOptions, prove

    s = Scenario(tmp_path)
    two_children(s)
    wf, ops, art = s.write()
    result = prove(ProveOptions(wf, ops, art, tmp_path / "bundle", proof_ceiling=1000))
    assert result.unrecordable is not None and "ceiling" in result.unrecordable


def test_begin_that_cannot_fit_is_recording_unavailable(tmp_path: Path) -> None:
    def build(max_bytes: int, where: str) -> Any:
        s = Scenario(tmp_path / where, limits={"maxBytes": max_bytes})
        two_children(s)
        return s.prove()

    m = fixed_point(lambda m: build(m, "fp"), lambda r: r.decisions[-1].acceptance[0])
    result = build(m - 1, "below")
    assert result.unrecordable is not None and "nothing is begun" in result.unrecordable
    _, epochs = proof_epochs(tmp_path / "below" / "bundle")
    assert len(epochs) == 3


def test_finalization_files_and_overflow(tmp_path: Path) -> None:
    def build(where: str, limits: dict[str, int] | None = None) -> Scenario:
        s = Scenario(tmp_path / where, limits=limits)
        two_children(s)
        s.evaluated("a", 1, people("Ann"))
        s.evaluated("b", 1, people("Bob"))
        s.file("notes.txt", b"notes\n")
        s.finish({"README.md": "notes.txt", "aux/chain/notes.txt": "notes.txt"})
        return s

    result = build("ok").prove()
    files = read_tree(tmp_path / "ok" / "bundle")
    assert files["README.md"] == b"notes\n" and files["aux/chain/notes.txt"] == b"notes\n"
    assert result.bytes == sum(len(b) for b in files.values())
    # the admissions fit without the finalization files; the final export does not
    limit = result.bytes - 1 + (len(str(result.bytes - 1)) - len(str(10_000_000)))
    with pytest.raises(InputRefused, match="finalization overflow") as info:
        build("over", {"maxBytes": limit}).prove()
    assert ":8:" in str(info.value)


def test_bad_input_names_the_line_and_leaves_the_previous_bundle(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.finish()
    s.prove()
    before = read_tree(tmp_path / "bundle")
    wf, ops, art = s.write()
    from crucible.proof.writer import ProveOptions, prove

    lines = ops.read_bytes().splitlines(keepends=True)
    cases = {
        "bad-json": (b"{not json\n", ParseError, ":3"),
        "bad-id": (
            canon.dumps(
                {"op": "retry", "instance": "../x", "actor": "a", "at": "2026-10-17T09:00:00Z"}
            )
            + b"\n",
            InputRefused,
            ":3",
        ),
        "missing": (
            canon.dumps(
                {
                    "op": "observe",
                    "instance": "r",
                    "attempt": 1,
                    "state": "evaluated",
                    "failure": None,
                    "files": {"run": "nope.json", "preparation": "nope", "audit": "nope"},
                }
            )
            + b"\n",
            InputRefused,
            ":3",
        ),
        "escape": (
            canon.dumps({"op": "root", "execution": "e", "rootInstance": "r", "case": "../x"})
            + b"\n",
            InputRefused,
            ":1",
        ),
    }
    for name, (line, exc, where) in cases.items():
        mutated = list(lines)
        mutated[int(where[1:]) - 1] = line
        bad = tmp_path / f"{name}.ndjson"
        bad.write_bytes(b"".join(mutated))
        with pytest.raises(exc) as info:
            prove(ProveOptions(wf, bad, art, tmp_path / "bundle"))
        assert f"{bad}{where}" in str(info.value)
        assert read_tree(tmp_path / "bundle") == before
    assert not list(tmp_path.glob(".bundle.*"))


def test_crash_during_export_leaves_previous_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crucible.proof.writer._prove as writer

    s = Scenario(tmp_path)
    two_children(s)
    s.finish()
    s.prove()
    before = read_tree(tmp_path / "bundle")
    s.evaluated("a", 1, people("Ann"))
    s.ops.append(s.ops.pop(-2))  # keep finish last

    def crash(*_: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(writer, "swap_into", crash)
    with pytest.raises(OSError):
        s.prove()
    assert read_tree(tmp_path / "bundle") == before
    assert not list(tmp_path.glob(".bundle.*"))


def test_out_must_be_a_bundle_or_absent(tmp_path: Path) -> None:
    from crucible.core.errors import UsageError

    s = Scenario(tmp_path)
    s.root_op()
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "file").write_text("keep")
    with pytest.raises(UsageError, match="not a bundle"):
        s.prove(tmp_path / "precious")
    assert (tmp_path / "precious" / "file").read_text() == "keep"


def test_root_that_cannot_fit_writes_nothing(tmp_path: Path) -> None:
    s = Scenario(tmp_path, limits={"maxBytes": 100})
    s.root_op()
    with pytest.raises(OperationalError, match="no bundle written"):
        s.prove()
    assert not (tmp_path / "bundle").exists()


def test_selection_needs_unconsumed_closed_stage_and_revision_limit(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "consumed")
    evaluated_root(s, "Acme")
    s.select("org", [("r", 0)], ["a"])
    s.select("org", [("r", 0)], ["b"])
    with pytest.raises(Forbidden, match="consumed; a new one requires a fork"):
        s.prove()
    s = Scenario(tmp_path / "blocked")
    s.root_op()
    s.select("people", [], [])
    with pytest.raises(Forbidden, match="blocked"):
        s.prove()
    s = Scenario(tmp_path / "revisions", limits={"maxInstances": 1})
    evaluated_root(s, "Acme")
    for _ in range(17):
        s.select("org", [("r", 0)], None)  # count refusals, each a revision
    with pytest.raises(Forbidden, match="16 revisions"):
        s.prove()


def test_empty_root_selection_consumes_and_freezes_root(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    s.root_op()
    s.group(1, ["r"])
    s.failed("r", 1)
    s.select("org", [], [])
    s.retry("r")
    with pytest.raises(Forbidden, match="new execution"):
        s.prove()


def test_late_observation_of_unknown_attempt_is_refused(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.observe("a", 5, "interrupted")
    with pytest.raises(Forbidden, match="matches no begun slot"):
        s.prove()


def test_late_observation_with_missing_files_is_kept_without_failing(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    s.evaluated("a", 1, people("Ann"))
    s.evaluated("b", 1, people("Bob"))
    s.observe("a", 1, "interrupted", None, {"run": "never/arrived.json"})
    s.finish()
    result = s.prove()
    assert result.custody is not None
    items = canon.loads((result.custody / "custody.json").read_bytes())["items"]
    assert items == [{"line": 8, "instance": "a", "attempt": 1, "reason": "late", "files": {}}]


def test_fork_frees_no_instance_budget_and_a_refused_fork_unconsumes(tmp_path: Path) -> None:
    s = Scenario(tmp_path, limits={"maxInstances": 4})
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], ["a", "b"])  # reserved: 3
    s.select("org", [("r", 0), ("r", 1)], ["a2", "b2"], fork=True)  # 3 + 2 > 4: refused
    s.select("org", [("r", 0)], ["a3"])  # org unconsumed again: a selection (3 + 1 = 4 fits)
    s.finish()
    result = s.prove()
    outcomes = [(d.kind, d.outcome) for d in result.decisions if d.kind in ("selection", "fork")]
    assert outcomes == [("selection", "admitted"), ("fork", "refused"), ("selection", "admitted")]
    b = tmp_path / "bundle"
    assert [i["id"] for i in execution(b)["instances"]] == ["r", "a3"]
    _, epochs = proof_epochs(b)
    assert epochs[3]["childIds"] is None  # the fork's count refusal allocates no ids
    files = read_tree(b)
    assert "refusal" in canon.loads(files["selections/org/2.json"])
    assert "instances/a/case.json" in files  # retired history stays


def test_operations_after_finish_or_stop_without_open_epoch_are_forbidden(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "after")
    s.root_op()
    s.finish()
    s.op(op="recover")
    with pytest.raises(Forbidden, match="follow finish"):
        s.prove()
    s = Scenario(tmp_path / "stop")
    s.root_op()
    s.op(op="cancel")
    with pytest.raises(Forbidden, match="needs an open epoch"):
        s.prove()
    s = Scenario(tmp_path / "first")
    s.group(1, ["r"])
    with pytest.raises(Forbidden, match="first operation must be root"):
        s.prove()


def test_structural_ceilings_are_recording_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crucible.proof import layout

    monkeypatch.setattr(layout, "MAX_PROOF_ARRAY", 1)
    s = Scenario(tmp_path / "array")
    two_children(s)
    result = s.prove()
    assert result.unrecordable is not None and "array ceiling" in result.unrecordable
    monkeypatch.undo()
    monkeypatch.setattr(layout, "MAX_BLOCKS", 1)
    monkeypatch.setattr(layout, "MAX_EPOCHS_PER_BLOCK", 3)
    s = Scenario(tmp_path / "epochs")
    two_children(s)
    result = s.prove()
    assert result.unrecordable is not None and "structural ceiling" in result.unrecordable
    assert result.epochs == 3


def test_symlinked_artifact_escaping_the_directory_is_refused(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    two_children(s)
    outside = tmp_path / "secret.json"
    outside.write_bytes(b'{"exportVersion":3,"finishedAt":null}')
    (s.artifacts / "link.json").symlink_to(outside)
    s.observe("a", 1, "interrupted", None, {"run": "link.json"})
    with pytest.raises(InputRefused, match="escapes the artifacts directory"):
        s.prove()


def test_root_case_must_be_canonical_and_shallow(tmp_path: Path) -> None:
    s = Scenario(tmp_path / "deep")
    deep: dict[str, Any] = {}
    for _ in range(70):
        deep = {"d": deep}
    s.root_op(deep)
    with pytest.raises(InputRefused, match="deeper than 64"):
        s.prove()
    s = Scenario(tmp_path / "spaces")
    s.root_op()
    s.file("root-case.json", b'{"topic": "x"}')
    with pytest.raises(InputRefused, match="canonical JSON object"):
        s.prove()


def test_one_signature_sidecar_belongs_to_one_attempt(tmp_path: Path) -> None:
    # Equal audit bytes may legitimately repeat; another attempt's sidecar may not.
    s = Scenario(tmp_path / "sig")
    two_children(s)
    s.evaluated("a", 1, people("Ann"), signature=b"sig-1")
    s.evaluated("b", 1, people("Ann"), signature=b"sig-1")
    with pytest.raises(Forbidden, match="signature sidecar belongs to one attempt"):
        s.prove()
    s = Scenario(tmp_path / "sig-ok")
    two_children(s)
    s.evaluated("a", 1, people("Ann"), signature=b"sig-1")
    s.evaluated("b", 1, people("Ann"), signature=b"sig-2")
    s.prove()


@pytest.mark.parametrize(
    ("targets", "needle"),
    [
        # each used to escape as OSError/FileExistsError (exit 70) or to write a
        # bundle name the reader refuses as not portable
        (["aux/" + "x" * 256], "component over 255 bytes"),
        (["aux/" + "d/" * 600 + "f"], "over 1024 bytes"),
        (["aux/a\nb"], "control character"),
        (["aux/\x7f"], "control character"),
        (["aux/x", "aux/x/y"], "also a directory"),
    ],
)
def test_finalization_paths_that_cannot_be_bundle_names_are_refused(
    tmp_path: Path, targets: list[str], needle: str
) -> None:
    s = Scenario(tmp_path)
    evaluated_root(s, "Acme")
    src = s.file("note.txt", b"note\n")
    s.finish({t: src for t in targets})
    with pytest.raises(InputRefused, match=needle) as info:
        s.prove()
    assert info.value.where is not None and info.value.where.endswith(f":{len(s.ops)}")
    assert not (tmp_path / "bundle").exists()


def test_finalization_path_at_the_name_bounds_is_written(tmp_path: Path) -> None:
    s = Scenario(tmp_path)
    evaluated_root(s, "Acme")
    src = s.file("note.txt", b"note\n")
    long_name = "aux/" + "é" * 127  # 254 bytes of UTF-8
    s.finish({long_name: src, "aux/x/y": src})
    s.prove()
    assert (tmp_path / "bundle" / long_name).read_bytes() == b"note\n"
