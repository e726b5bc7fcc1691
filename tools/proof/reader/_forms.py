"""Phase 1 closed-form checks (docs/spec/workflow.md, admission-proof.md).

Each function raises a phase-1 :class:`Problem` (``input-malformed``,
``input-over-bound``, ``version-unread`` or ``kind-unread``) naming the file.
Version selectors are checked before the rest of a document's closed form
(RFC 0024 §1: version-unread before applying the supported closed forms).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from crucible.core.digest import is_digest
from crucible.proof import layout
from crucible.proof.reader._findings import Problem, over_bound

__all__ = [
    "EPOCH_KINDS",
    "check_begin",
    "check_epoch",
    "check_execution",
    "check_partial",
    "check_proof_root",
    "check_run",
    "check_selection",
    "check_workflow",
    "is_id",
    "is_timestamp",
]

OBSERVATION_STATES = ("evaluated", "failed", "interrupted", "cancelled", "suppressed")
OBSERVATION_FAILURES = (
    "acquisition-failed",
    "preparation-failed",
    "admission-refused",
    "evaluation-error",
)
PINS = tuple(layout.ATTEMPT_FILES)
EPOCH_KINDS: dict[str, tuple[str, ...]] = {
    "root": (),
    "selection": ("stage", "revision", "selectionCoreDigest", "childIds"),
    "fork": ("stage", "revision", "selectionCoreDigest", "childIds"),
    "group": ("reservation", "starts", "deferred", "cancelled", "results"),
    "retry": ("begin", "results"),
}


def _bad(msg: str, path: str, epoch: int | None = None, obs: int | None = None) -> Problem:
    return Problem("input-malformed", 1, msg, path=path, epoch=epoch, observation=obs)


def _versioned(
    value: Any,
    what: str,
    member: str,
    versions: tuple[int, ...],
    path: str,
    label: str | None = None,
) -> None:
    """An object whose version selector ``member`` is one we read; checked before the
    rest of its closed form (RFC 0024 §1)."""
    if type(value) is not dict:
        raise _bad(f"{what} is not an object", path)
    v = value.get(member)
    if type(v) is not int or v not in versions:
        wanted = " or ".join(str(n) for n in versions)
        raise Problem("version-unread", 1, f"{label or member} {v!r} is not {wanted}", path=path)


def _exact(
    v: Any,
    keys: tuple[str, ...],
    what: str,
    path: str,
    epoch: int | None = None,
    obs: int | None = None,
) -> dict[str, Any]:
    if type(v) is not dict:
        raise _bad(f"{what} is not an object", path, epoch, obs)
    if set(v) != set(keys) or len(v) != len(keys):
        extra = sorted(set(v) - set(keys))
        missing = sorted(set(keys) - set(v))
        raise _bad(f"{what}: unknown members {extra} / missing members {missing}", path, epoch, obs)
    return v


def is_id(v: Any) -> bool:
    return type(v) is str and layout.ID_RE.match(v) is not None


def is_stage(v: Any) -> bool:
    return type(v) is str and layout.STAGE_RE.match(v) is not None


def is_timestamp(v: Any) -> bool:
    if type(v) is not str or layout.TIMESTAMP_RE.match(v) is None:
        return False
    try:
        _dt.datetime.strptime(v, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


def _is_actor(v: Any) -> bool:
    return (
        type(v) is str
        and 1 <= len(v) <= 256
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in v)
    )


def _is_posint(v: Any) -> bool:
    return type(v) is int and v >= 1


def _text(v: Any, limit: int) -> bool:
    return (
        type(v) is str
        and 1 <= len(v) <= limit
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in v)
    )


def check_workflow(wf: Any, path: str = layout.WORKFLOW) -> None:
    _versioned(wf, "the workflow", "workflowVersion", (2,), path)
    _exact(wf, ("workflowVersion", "name", "limits", "stages"), "workflow", path)
    if not _text(wf["name"], 128):
        raise _bad("name: 1-128 characters without controls", path)
    limits = _exact(wf["limits"], layout.LIMIT_NAMES, "limits", path)
    for k in layout.LIMIT_NAMES:
        if not _is_posint(limits[k]):
            raise _bad(f"limits.{k} is not a positive integer", path)
    stages = wf["stages"]
    if type(stages) is not list or not 1 <= len(stages) <= 64:
        raise _bad("stages: 1-64 stages", path)
    seen: set[str] = set()
    for i, st in enumerate(stages):
        _exact(st, ("name", "input", "output"), f"stages[{i}]", path)
        name = st["name"]
        if not is_stage(name) or name in seen:
            raise _bad(f"stages[{i}].name is not a valid unique stage name", path)
        inp = _exact(
            st["input"], ("fromStage", "fields", "admitMaxBytes"), f"stages[{i}].input", path
        )
        out = _exact(st["output"], ("pointer", "cardinality"), f"stages[{i}].output", path)
        frm = inp["fromStage"]
        if i == 0:
            if frm is not None or inp["fields"] is not None or inp["admitMaxBytes"] is not None:
                raise _bad("the root stage's input must be all null", path)
        else:
            if type(frm) is not str or frm not in seen:
                raise _bad(f"stages[{i}].input.fromStage must name an earlier stage", path)
            fields = inp["fields"]
            if fields is not None and (
                type(fields) is not list
                or not fields
                or any(type(f) is not str for f in fields)
                or len(set(fields)) != len(fields)
            ):
                raise _bad(f"stages[{i}].input.fields: null or distinct member names", path)
            if inp["admitMaxBytes"] is not None and not _is_posint(inp["admitMaxBytes"]):
                raise _bad(f"stages[{i}].input.admitMaxBytes: null or a positive integer", path)
        ptr = out["pointer"]
        if type(ptr) is not str or (ptr and not ptr.startswith("/")):
            raise _bad(f"stages[{i}].output.pointer is not a JSON pointer", path)
        if out["cardinality"] not in ("one", "many"):
            raise _bad(f"stages[{i}].output.cardinality is not one|many", path)
        seen.add(name)


def check_proof_root(
    proof: Any, blocks: list[int] | None, path: str = layout.ADMISSION_PROOF
) -> None:
    """The root's members (``proof`` without ``epochBlocks``) and its block sizes
    (None when ``epochBlocks`` is missing or not an array of arrays)."""
    _versioned(proof, "the proof", "admissionProofVersion", (1,), path)
    _exact(
        proof,
        (
            "admissionProofVersion",
            "workflowDigest",
            "execution",
            "rootCaseDigest",
            "frozenDigest",
            "rootInstance",
        ),
        "proof root",
        path,
    )
    for k in ("workflowDigest", "rootCaseDigest", "frozenDigest"):
        if not is_digest(proof[k]):
            raise _bad(f"{k} is not a digest", path)
    if not is_id(proof["execution"]) or not is_id(proof["rootInstance"]):
        raise _bad("execution/rootInstance is not a valid id", path)
    if blocks is None:
        raise _bad("epochBlocks is not an array of arrays", path)
    if len(blocks) > layout.MAX_BLOCKS:
        raise over_bound(f"{len(blocks)} epoch blocks (at most {layout.MAX_BLOCKS})", path)
    for b in blocks:
        if b > layout.MAX_EPOCHS_PER_BLOCK:
            raise over_bound(f"a block of {b} epochs", path)
    if not blocks:
        raise _bad("epochBlocks is empty (P0 is never an export)", path)
    for i, b in enumerate(blocks):
        if not b or (i < len(blocks) - 1 and b != layout.MAX_EPOCHS_PER_BLOCK):
            raise _bad(f"epochBlocks[{i}] breaks the full-block rule", path)


def check_begin(b: Any, path: str, epoch: int, what: str) -> None:
    _exact(b, ("instance", "number", "retry"), what, path, epoch)
    if not is_id(b["instance"]) or not _is_posint(b["number"]):
        raise _bad(f"{what}: bad instance or number", path, epoch)
    r = b["retry"]
    if r is not None:
        _exact(r, ("actor", "at"), f"{what}.retry", path, epoch)
        if not _is_actor(r["actor"]) or not is_timestamp(r["at"]):
            raise _bad(f"{what}.retry: bad actor or timestamp", path, epoch)
    if (r is None) != (b["number"] == 1):
        raise _bad(f"{what}: retry must be null exactly for attempt 1", path, epoch)


def _check_observation(o: Any, path: str, epoch: int, j: int) -> None:
    _exact(o, ("instance", "number", "state", "failure", *PINS), "observation", path, epoch, j)
    if not is_id(o["instance"]) or not _is_posint(o["number"]):
        raise _bad("observation: bad instance or number", path, epoch, j)
    if o["state"] not in OBSERVATION_STATES:
        raise _bad(f"observation state {o['state']!r}", path, epoch, j)
    if (o["state"] == "failed") != (o["failure"] is not None):
        raise _bad("failure is non-null exactly for failed", path, epoch, j)
    if o["failure"] is not None and o["failure"] not in OBSERVATION_FAILURES:
        raise _bad(f"observation failure {o['failure']!r}", path, epoch, j)
    for p in PINS:
        if o[p] is not None and not is_digest(o[p]):
            raise _bad(f"{p} is not a digest or null", path, epoch, j)


def check_epoch(e: Any, number: int, path: str = layout.ADMISSION_PROOF) -> None:
    """The closed form of epoch ``number`` (its position after flattening)."""
    if type(e) is not dict:
        raise _bad("an epoch is not an object", path, number)
    kind = e.get("kind")
    if type(kind) is not str:
        raise _bad("epoch kind is not a string", path, number)
    if kind not in EPOCH_KINDS:
        raise Problem("kind-unread", 1, f"epoch kind {kind!r} is not read", path=path, epoch=number)
    _exact(
        e,
        ("number", "previousProofDigest", "kind", *EPOCH_KINDS[kind]),
        f"{kind} epoch",
        path,
        number,
    )
    if type(e["number"]) is not int or e["number"] != number:
        raise _bad(f"epoch number {e['number']!r} where {number} is due", path, number)
    if not is_digest(e["previousProofDigest"]):
        raise _bad("previousProofDigest is not a digest", path, number)
    if (kind == "root") != (number == 1):
        raise _bad("the root epoch is epoch 1 and occurs exactly once", path, number)
    if kind in ("selection", "fork"):
        if not is_stage(e["stage"]) or not _is_posint(e["revision"]):
            raise _bad("bad stage or revision", path, number)
        if e["revision"] > layout.MAX_REVISIONS:
            raise over_bound(f"revision {e['revision']} > {layout.MAX_REVISIONS}", path, number)
        if not is_digest(e["selectionCoreDigest"]):
            raise _bad("selectionCoreDigest is not a digest", path, number)
        ids = e["childIds"]
        if ids is not None and (type(ids) is not list or not all(is_id(i) for i in ids)):
            raise _bad("childIds: null or an array of valid ids", path, number)
    elif kind == "group":
        r = e["reservation"]
        if not _is_posint(r) or r >= number:
            raise _bad("reservation must name an earlier epoch", path, number)
        for i, b in enumerate(_array(e["starts"], "starts", path, number)):
            check_begin(b, path, number, f"starts[{i}]")
        for d in _array(e["deferred"], "deferred", path, number):
            if not is_id(d):
                raise _bad("deferred holds a bad id", path, number)
        for i, c in enumerate(_array(e["cancelled"], "cancelled", path, number)):
            _exact(c, ("instance", "actor", "at"), f"cancelled[{i}]", path, number)
            if not is_id(c["instance"]) or not _is_actor(c["actor"]) or not is_timestamp(c["at"]):
                raise _bad(f"cancelled[{i}]: bad instance, actor or timestamp", path, number)
        results = _array(e["results"], "results", path, number)
        if len(results) > len(e["starts"]):
            raise _bad("more results than starts", path, number)
        for j, o in enumerate(results, 1):
            _check_observation(o, path, number, j)
    elif kind == "retry":
        check_begin(e["begin"], path, number, "begin")
        if e["begin"]["retry"] is None:
            raise _bad("a retry's begin carries a retry assertion", path, number)
        results = _array(e["results"], "results", path, number)
        if len(results) > 1:
            raise _bad("a retry has at most one result", path, number)
        for j, o in enumerate(results, 1):
            _check_observation(o, path, number, j)


def _array(v: Any, what: str, path: str, epoch: int) -> list[Any]:
    if type(v) is not list:
        raise _bad(f"{what} is not an array", path, epoch)
    return v


def check_execution(ex: Any, path: str = layout.EXECUTION) -> None:
    """Version selector and top-level closed form; contents are compared in phase 5."""
    _versioned(ex, "the execution", "executionVersion", (2,), path)
    _exact(
        ex,
        (
            "executionVersion",
            "execution",
            "workflowDigest",
            "admissionProofDigest",
            "frozen",
            "stages",
            "instances",
        ),
        "execution",
        path,
    )
    for k in ("workflowDigest", "admissionProofDigest"):
        if not is_digest(ex[k]):
            raise _bad(f"{k} is not a digest", path)
    if (
        type(ex["frozen"]) is not list
        or type(ex["stages"]) is not list
        or type(ex["instances"]) is not list
    ):
        raise _bad("frozen, stages and instances are arrays", path)


def check_selection(sel: Any, path: str) -> bool:
    """Closed form of a retained selection; True when it is refusal-bearing."""
    _versioned(sel, "a selection", "selectionVersion", (1,), path)
    keys = ("selectionVersion", "stage", "revision", "review", "offeredDigest", "selected")
    refused = "refusal" in sel
    _exact(sel, (*keys, "refusal") if refused else keys, "selection", path)
    if refused and sel["refusal"] != "limit-exceeded":
        raise _bad('refusal is exactly "limit-exceeded"', path)
    review = _exact(sel["review"], ("actor", "at"), "review", path)
    if not _is_actor(review["actor"]) or not is_timestamp(review["at"]):
        raise _bad("review: bad actor or timestamp", path)
    if (
        not is_stage(sel["stage"])
        or not _is_posint(sel["revision"])
        or not is_digest(sel["offeredDigest"])
    ):
        raise _bad("bad stage, revision or offeredDigest", path)
    if type(sel["selected"]) is not list:
        raise _bad("selected is not an array", path)
    for i, m in enumerate(sel["selected"]):
        _exact(m, ("instance", "output"), f"selected[{i}]", path)
        if not is_id(m["instance"]) or type(m["output"]) is not int or m["output"] < 0:
            raise _bad(f"selected[{i}]: bad instance or output", path)
    return refused


def check_run(run: Any, path: str) -> Any:
    """Version selector and ``finishedAt`` form of a retained run export."""
    _versioned(run, "a run export", "exportVersion", (2, 3), path, label="run exportVersion")
    if "finishedAt" not in run:
        raise _bad("a run export has finishedAt", path)
    fa = run["finishedAt"]
    if fa is not None and not is_timestamp(fa):
        raise _bad(f"finishedAt {fa!r} is not a UTC second", path)
    return fa


def check_partial(p: Any, path: str = layout.PARTIAL) -> None:
    _versioned(p, "partial.json", "partialVersion", (1,), path)
    _exact(p, ("partialVersion", "reason", "operationLine"), "partial", path)
    if p["reason"] not in ("open-epoch", "no-finish", "recording-unavailable"):
        raise _bad("partial reason", path)
    if p["operationLine"] is not None and not _is_posint(p["operationLine"]):
        raise _bad("partial operationLine", path)
