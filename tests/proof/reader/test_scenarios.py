"""RFC 0024's required recording cases, built from the spec and read at byte boundaries.

Boundaries are found by measuring complete exports (never asserted): a variant that
stops right after a decision *is* that decision's candidate, so its byte length is
the candidate's size. maxBytes keeps the same number of digits while it is tuned,
so the workflow file's own length does not move the boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.proof.reader import verify_bundle
from tests.proof.reader.bundlegen import AT, Gen, stage, write_files

FIVE = 99_999  # placeholder with the digits of every tuned maxBytes below


def read(tmp: Path, g: Gen, extra: dict[str, bytes] | None = None) -> Any:
    files = g.exported()
    files.update(extra or {})
    root = tmp / f"b{len(list(tmp.iterdir()))}"
    write_files(root, files)
    return verify_bundle(root)


def size(g: Gen) -> int:
    return sum(len(v) for v in g.exported().values())


def problem(r: Any) -> tuple[str, int, int | None, int | None] | None:
    p = r.problem
    return None if p is None else (p.code, p.phase, p.epoch, p.observation)


def records(n: int, width: int = 60) -> dict[str, Any]:
    return {"items": [{"name": f"r{i}", "text": "x" * width} for i in range(n)]}


# ---------------------------------------------------------------- output refusals


def one_stage(max_bytes: int, accept: bool, n: int = 5) -> Gen:
    g = Gen([stage("org")], limits={"maxBytes": max_bytes})
    g.group(1, ["root"])
    g.observe("root", audit=records(n), accept=accept)
    return g


def boundary(build: Callable[[int], Gen]) -> int:
    """The measured size of ``build``'s export, with a maxBytes of the same digit count."""
    for placeholder in (9_999, 99_999, 999_999):
        s = size(build(placeholder))
        if len(str(s)) == len(str(placeholder)):
            return s
    raise AssertionError("no stable boundary")


def test_false_refusal_when_the_candidate_fits(tmp_path: Path) -> None:
    s_acc = boundary(lambda m: one_stage(m, True))
    assert size(one_stage(s_acc, True)) == s_acc
    # the boundary: the accepted export fits exactly (equality fits) ...
    assert problem(read(tmp_path, one_stage(s_acc, True))) is None
    # ... so a refusal there is false, whatever the writer labels it
    assert problem(read(tmp_path, one_stage(s_acc, False))) == ("output-mismatch", 4, 2, 1)
    # one byte less: the acceptance candidate is over, the refusal genuine
    assert problem(read(tmp_path, one_stage(s_acc - 1, False))) is None
    # ... and an export claiming acceptance is itself over the bound
    assert problem(read(tmp_path, one_stage(s_acc - 1, True)))[:2] == ("input-over-bound", 1)  # type: ignore[index]


def siblings(
    max_bytes: int,
    plan: list[tuple[str, str]],
    max_records: int = 100_000,
    order: tuple[str, ...] = ("a", "b", "c"),
    close: bool = True,
) -> Gen:
    """org root offers three records; people children a, b, c; each child proposes records."""
    g = Gen(
        [stage("org"), stage("people", "org", ["name"], pointer="/items")],
        limits={"maxBytes": max_bytes, "maxRecords": max_records},
    )
    g.group(1, ["root"])
    g.observe("root", audit={"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})
    r = g.select("org", [("root", 0), ("root", 1), ("root", 2)], ["a", "b", "c"])
    g.group(r, [i for i in ("a", "b", "c") if i in order])
    for iid, what in plan:
        if what == "accept":
            g.observe(iid, audit=records(6))
        elif what == "refuse":
            g.observe(iid, audit=records(6), accept=False)
        elif what == "suppress":
            g.observe(iid, state="suppressed", files={})
    return g


def test_cutoff_and_suppressed(tmp_path: Path) -> None:
    # b's acceptance candidate: the epoch stopped right after b is accepted
    s_b = boundary(lambda m: siblings(m, [("a", "accept"), ("b", "accept")]))
    final = siblings(s_b - 1, [("a", "accept"), ("b", "refuse"), ("c", "suppress")])
    assert size(final) <= s_b - 1
    assert problem(read(tmp_path, final)) is None
    # suppressed without an earlier cutoff in the epoch is not a valid form
    g = siblings(FIVE, [("a", "accept"), ("b", "accept"), ("c", "suppress")])
    assert problem(read(tmp_path, g)) == ("inventory-mismatch", 4, 4, 3)
    # after a cutoff, a later valid proposal is refused without measurement
    g = siblings(FIVE, [("a", "accept"), ("b", "refuse"), ("c", "refuse")])
    assert problem(read(tmp_path, g)) == ("output-mismatch", 4, 4, 2)  # b's refusal is false


@pytest.mark.parametrize("first", ["a", "b"])
def test_opposite_completion_order_record_limit(tmp_path: Path, first: str) -> None:
    """Each sibling offers six records with ten remaining: canonical order admits the first."""
    second = "b" if first == "a" else "a"
    starts = (first, second)
    g = Gen(
        [stage("org"), stage("people", "org", ["name"], pointer="/items")],
        limits={"maxRecords": 13},
    )
    g.group(1, ["root"])
    g.observe("root", audit={"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})
    r = g.select(
        "org",
        [("root", 0), ("root", 1)] if first == "a" else [("root", 1), ("root", 0)],
        list(starts),
    )
    g.group(r, list(starts))
    g.observe(first, audit=records(6))
    g.observe(second, audit=records(6), accept=False)
    assert problem(read(tmp_path, g)) is None
    bad = Gen.__new__(Gen)  # the opposite claim: second accepted, first refused
    g2 = Gen(
        [stage("org"), stage("people", "org", ["name"], pointer="/items")],
        limits={"maxRecords": 13},
    )
    g2.group(1, ["root"])
    g2.observe("root", audit={"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})
    r = g2.select(
        "org",
        [("root", 0), ("root", 1)] if first == "a" else [("root", 1), ("root", 0)],
        list(starts),
    )
    g2.group(r, list(starts))
    g2.observe(first, audit=records(6), accept=False)
    g2.observe(second, audit=records(6))
    del bad
    assert problem(read(tmp_path, g2)) == ("output-mismatch", 4, 4, 1)


def test_earlier_sibling_retry_after_later_refusal(tmp_path: Path) -> None:
    def build(max_bytes: int, b_refused: bool, retry: bool) -> Gen:
        g = Gen(
            [stage("org"), stage("people", "org", ["name"], pointer="/items")],
            limits={"maxBytes": max_bytes},
        )
        g.group(1, ["root"])
        g.observe("root", audit={"items": [{"name": "a"}, {"name": "b"}]})
        r = g.select("org", [("root", 0), ("root", 1)], ["a", "b"])
        g.group(r, ["a", "b"])
        g.observe("a", state="failed", failure="acquisition-failed")
        g.observe("b", audit=records(12, 120), accept=not b_refused)
        if retry:
            g.retry("a")
            g.observe("a", audit=records(1, 10))
        return g

    s_b = boundary(lambda m: build(m, False, False))  # b's acceptance candidate, at b's own prefix
    final = build(s_b - 1, True, True)
    assert size(final) <= s_b - 1, "the retry must fit the same bound"
    assert problem(read(tmp_path, final)) is None  # b stays refused: its prefix is unchanged
    # a fitting b candidate: a's later bytes cannot justify a fabricated old refusal
    roomy = build(size(build(FIVE, False, True)), True, True)
    assert problem(read(tmp_path, roomy)) == ("output-mismatch", 4, 4, 2)


# ---------------------------------------------------------------- selection refusals


def selection(
    max_bytes: int = FIVE,
    max_instances: int = 10_000,
    max_case: int = 4096,
    ids: list[str] | None = None,
    refused: bool = False,
    then: Callable[[Gen, int], None] | None = None,
) -> Gen:
    g = Gen(
        [
            stage("org"),
            stage("people", "org", ["name"], pointer="/items"),
            stage("notes", "org", None, pointer="/items"),
        ],
        limits={"maxBytes": max_bytes, "maxInstances": max_instances, "maxCaseBytes": max_case},
    )
    g.group(1, ["root"])
    g.observe("root", audit={"items": [{"name": "acme"}, {"name": "globex"}]})
    ids = ids if ids is not None else ["p1", "p2", "n1", "n2"]
    r = g.select("org", [("root", 0), ("root", 1)], ids, refused=refused)
    if then:
        then(g, r)
    return g


def test_count_refusal_needs_null_ids(tmp_path: Path) -> None:
    ok = selection(max_instances=4, ids=None, refused=True)  # type: ignore[arg-type]
    ok.epochs[-1]["childIds"] = None
    assert problem(read(tmp_path, ok)) is None
    r = read(tmp_path, ok)
    assert r.reading.completion == "partial" and r.reading.counts.instances == 1
    given = selection(max_instances=4, refused=True)
    assert problem(read(tmp_path, given)) == ("inventory-mismatch", 4, 3, None)
    fits = selection(max_instances=5, refused=True)
    fits.epochs[-1]["childIds"] = None
    assert problem(read(tmp_path, fits)) == ("inventory-mismatch", 4, 3, None)


def test_local_case_bound_refusal(tmp_path: Path) -> None:
    assert problem(read(tmp_path, selection(max_case=40, refused=True))) is None
    assert problem(read(tmp_path, selection(max_case=40, refused=False))) == (
        "selection-mismatch",
        4,
        3,
        None,
    )


def test_long_and_short_prospective_ids(tmp_path: Path) -> None:
    short = ["p1", "p2", "n1", "n2"]
    long = [c * 100 + str(i) for i, c in enumerate("pqrs")]
    s_short = boundary(lambda m: selection(max_bytes=m, ids=short))
    s_long = boundary(lambda m: selection(max_bytes=m, ids=long))
    assert s_long > s_short
    assert size(selection(max_bytes=s_short, ids=short)) == s_short  # exactly at the bound
    # one byte less and the short reservation is refused too
    assert (
        problem(read(tmp_path, selection(max_bytes=s_short - 1, ids=short, refused=True))) is None
    )
    assert problem(read(tmp_path, selection(max_bytes=s_short - 1, ids=short)))[:2] == (  # type: ignore[index]
        "input-over-bound",
        1,
    )
    assert problem(read(tmp_path, selection(max_bytes=s_short, ids=short))) is None
    assert problem(read(tmp_path, selection(max_bytes=s_short, ids=long, refused=True))) is None
    # the same long ids at a bound they fit: a refusal there is false
    assert problem(read(tmp_path, selection(max_bytes=s_long, ids=long, refused=True))) == (
        "selection-mismatch",
        4,
        3,
        None,
    )


def test_refused_revision_then_revision_two(tmp_path: Path) -> None:
    long = [c * 100 + str(i) for i, c in enumerate("pqrs")]
    s_short = boundary(lambda m: selection(max_bytes=m, ids=["p1", "p2", "n1", "n2"]))

    def revise(ids: list[str]) -> Callable[[Gen, int], None]:
        def then(g: Gen, _: int) -> None:
            g.select("org", [("root", 1)], ids)

        return then

    margin = s_short + 600
    ok = selection(max_bytes=margin, ids=long, refused=True, then=revise(["p9", "n9"]))
    assert problem(read(tmp_path, ok)) is None
    reuse = selection(max_bytes=margin, ids=long, refused=True, then=revise([long[0], "n9"]))
    assert problem(read(tmp_path, reuse)) == ("inventory-mismatch", 4, 4, None)


def test_fork_retires_descendants_and_frees_nothing(tmp_path: Path) -> None:
    def then(g: Gen, r: int) -> None:
        g.group(r, ["p1"])
        g.observe("p1", audit=records(1, 5))
        g.select("org", [("root", 1)], ["p3", "n3"], fork=True)

    g = selection(then=then)
    r = read(tmp_path, g)
    assert problem(r) is None
    assert r.reading.counts.instances == 3

    # a fork reusing a retired id
    def reuse(g: Gen, r: int) -> None:
        g.select("org", [("root", 1)], ["p1", "n3"], fork=True)

    forged = selection(then=reuse)
    original = selection().exported()["instances/p1/case.json"]
    assert problem(read(tmp_path, forged, {"instances/p1/case.json": original})) == (
        "inventory-mismatch",
        4,
        4,
        None,
    )

    # a group over the retired reservation
    def retired(g: Gen, r: int) -> None:
        g.select("org", [("root", 1)], ["p3", "n3"], fork=True)
        g.epochs.append(
            {
                "number": len(g.epochs) + 1,
                "previousProofDigest": "",
                "kind": "group",
                "reservation": r,
                "starts": [{"instance": "p2", "number": 1, "retry": None}],
                "deferred": [],
                "cancelled": [],
                "results": [],
            }
        )

    g = selection(then=retired)
    from tests.proof.reader.mutate import Bundle

    files = Bundle(g.exported()).finish()
    root = tmp_path / "retired"
    write_files(root, files)
    assert problem(verify_bundle(root))[:2] == ("inventory-mismatch", 4)  # type: ignore[index]


def test_first_begin_after_consumption_needs_a_fork(tmp_path: Path) -> None:
    g = Gen(
        [
            stage("org"),
            stage("people", "org", ["name"], pointer="/items"),
            stage("tasks", "people", None, pointer="/items"),
        ]
    )
    g.group(1, ["root"])
    g.observe("root", audit={"items": [{"name": "a"}, {"name": "b"}]})
    r = g.select("org", [("root", 0), ("root", 1)], ["a", "b"])
    g.group(r, ["a"])  # b deferred
    g.observe("a", audit=records(1, 5))
    g.select("people", [("a", 0)], ["t1"])  # consumes people
    assert problem(read(tmp_path, g)) is None
    g.group(r, ["b"])
    g.observe("b", audit=records(1, 5))
    assert problem(read(tmp_path, g)) == ("inventory-mismatch", 4, 6, None)


# ---------------------------------------------------------------- membership, recovery


def test_defer_only_group_is_invalid(tmp_path: Path) -> None:
    g = siblings(FIVE, [], order=())
    assert problem(read(tmp_path, g)) == ("inventory-mismatch", 4, 4, None)


def test_open_epoch_must_say_partial(tmp_path: Path) -> None:
    g = siblings(FIVE, [("a", "accept")])
    assert problem(read(tmp_path, g))[:2] == ("inventory-mismatch", 5)  # type: ignore[index]
    partial = {
        "partial.json": canon.dumps(
            {"partialVersion": 1, "reason": "open-epoch", "operationLine": None}
        )
    }
    r = read(tmp_path, g, partial)
    assert problem(r) is None and r.reading.completion == "partial"


def test_interrupted_and_cancelled_observations(tmp_path: Path) -> None:
    g = siblings(FIVE, [("a", "accept")])
    g.observe(
        "b",
        state="interrupted",
        files={"runDigest": canon.dumps({"exportVersion": 3, "finishedAt": None})},
    )
    g.observe("c", state="cancelled", files={})
    r = read(tmp_path, g)
    assert problem(r) is None and r.reading.completion == "partial"
    # an interrupted observation cannot conceal a complete evaluation
    g = siblings(FIVE, [("a", "accept")])
    g.observe(
        "b",
        state="interrupted",
        files={
            "runDigest": canon.dumps({"exportVersion": 3, "finishedAt": None}),
            "preparationDigest": canon.dumps({"p": 1}),
            "auditDigest": canon.dumps(records(1)),
        },
    )
    g.observe("c", state="cancelled", files={})
    assert problem(read(tmp_path, g)) == ("inventory-mismatch", 4, 4, 2)


def test_preparation_failed_needs_the_failing_instant(tmp_path: Path) -> None:
    g = siblings(FIVE, [("a", "accept")])
    g.observe("b", state="failed", failure="preparation-failed")
    g.observe("c", state="failed", failure="admission-refused", finished=None)
    assert problem(read(tmp_path, g)) == ("input-malformed", 1, 4, 3)


def test_equal_contents_at_separate_paths_count_separately(tmp_path: Path) -> None:
    def build(max_bytes: int) -> Gen:
        g = Gen(
            [stage("org"), stage("people", "org", None, pointer="/items")],
            limits={"maxBytes": max_bytes},
        )
        g.group(1, ["root"])
        g.observe("root", audit={"items": [{"n": 1}, {"n": 1}]})  # equal payloads, two paths
        r = g.select("org", [("root", 0), ("root", 1)], ["a", "b"])
        g.group(r, ["a", "b"])
        same = {
            "runDigest": canon.dumps({"exportVersion": 3, "finishedAt": AT}),
            "preparationDigest": canon.dumps({"p": 0}),
            "auditDigest": canon.dumps(records(1)),
        }
        g.observe("a", files=same)
        g.observe("b", files=same)
        return g

    total = size(build(FIVE))
    assert problem(read(tmp_path, build(total))) is None
    # without double counting the last acceptance would fit; it does not
    dup = len(canon.dumps(records(1)))
    r = read(tmp_path, build(total - dup))
    assert r.problem is not None and r.problem.code == "input-over-bound"
