"""Hypothesis properties of candidate measurement (issue 6, "Done means")."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crucible.core import canon
from tests.proof.writer.prove_helpers import (
    Scenario,
    evaluated_root,
    people,
    read_tree,
    two_children,
)

SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def run_with_ids(root: Path, ids: list[str]) -> list[dict[str, bytes]]:
    candidates: list[dict[str, bytes]] = []
    s = Scenario(root)
    evaluated_root(s, "Acme", "Globex")
    s.select("org", [("r", 0), ("r", 1)], ids)
    s.group(3, ids)
    s.evaluated(ids[1], 1, people("Bob"))
    s.evaluated(ids[0], 1, people("Ann", "Al"))
    s.select("people", [(ids[0], 1)], [])
    s.finish()
    from crucible.proof.writer import ProveOptions, prove

    wf, ops, art = s.write()
    prove(
        ProveOptions(
            wf, ops, art, root / "bundle", True, candidate_hook=candidates.append, durable=False
        )
    )
    return candidates


@SETTINGS
@given(base=st.integers(min_value=0, max_value=20), extra=st.integers(min_value=1, max_value=100))
def test_longer_child_id_adds_exactly_its_serialized_bytes(base: int, extra: int) -> None:
    short_id = "Q" + "q" * base
    long_id = "Q" + "q" * (base + extra)
    with tempfile.TemporaryDirectory() as tmp:
        short = run_with_ids(Path(tmp) / "s", [short_id, "b"])
        long = run_with_ids(Path(tmp) / "l", [long_id, "b"])
    assert len(short) == len(long) > 5
    affected = 0
    for a, b in zip(short, long, strict=True):
        assert set(a) == {p.replace(long_id, short_id) for p in b}  # same paths, renamed
        occurrences = sum(data.count(long_id.encode()) for data in b.values())
        assert occurrences == sum(data.count(short_id.encode()) for data in a.values())
        size_a = sum(len(x) for x in a.values())
        size_b = sum(len(x) for x in b.values())
        assert size_b - size_a == extra * occurrences
        affected += occurrences > 0
    assert affected >= 4  # the selection and everything after it


@SETTINGS
@given(
    record=st.dictionaries(
        st.text("abcxyz", min_size=1, max_size=5),
        st.one_of(st.integers(-1000, 1000), st.text(max_size=20), st.booleans()),
        max_size=4,
    )
)
def test_equal_contents_at_two_paths_count_twice(record: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        s = Scenario(root)
        two_children(s)
        shared = {
            "run": s.file("same/run.json", {"exportVersion": 3, "finishedAt": None}),
            "preparation": s.file("same/preparation.json", {"prepared": True}),
            "audit": s.file("same/audit.json", {"people": [{"name": "P", **record}]}),
        }
        for iid in ("a", "b"):
            s.op(
                op="observe", instance=iid, attempt=1, state="evaluated", failure=None, files=shared
            )
        s.finish()
        result = s.prove()
        files = read_tree(root / "bundle")
    assert result.bytes == sum(len(x) for x in files.values())
    assert result.files == len(files)
    a_audit = files["instances/a/attempts/1/audit.json"]
    assert a_audit == files["instances/b/attempts/1/audit.json"]
    assert files["outputs/people/a/1/0.payload.json"] == files["outputs/people/b/1/0.payload.json"]
    distinct_contents = sum(len(x) for x in set(files.values()))
    assert result.bytes > distinct_contents
    payload = canon.dumps({"name": "P", **record})
    assert files["outputs/people/b/1/0.payload.json"] == payload
