"""The small forms of an accounted run (docs/spec/export.md §4): child ids, the actor,
the ``at`` clock, content-addressed attempt files, the report's refusal label."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crucible.core import digest
from crucible.core.errors import UsageError
from crucible.run.accounting import _forms as forms
from crucible.run.report._accounting import refused_label

TASK = st.from_regex(r"\A[a-z][a-z0-9-]{0,31}\Z")


@given(TASK, st.text(max_size=140))
def test_a_child_id_is_a_record_id_or_none_and_names_its_task_and_key(task: str, key: str) -> None:
    cid = forms.child_id(task, key)
    if cid is None:
        assert not forms.ID_RE.match(f"{task}.{key}")
        return
    assert forms.ID_RE.match(cid)
    # injective: a task name has no dot, so the first dot splits it back
    assert cid.split(".", 1) == [task, key]


@given(st.text(min_size=1, max_size=256))
def test_an_actor_with_a_control_character_is_refused(actor: str) -> None:
    bad = any(ord(c) < 0x20 or ord(c) == 0x7F for c in actor)
    if bad:
        with pytest.raises(UsageError, match="control character"):
            forms.check_actor(actor)
    else:
        assert forms.check_actor(actor) == actor


def test_an_actor_over_256_characters_or_empty_is_refused() -> None:
    for actor in ("", "x" * 257):
        with pytest.raises(UsageError, match="1-256"):
            forms.check_actor(actor)


def test_at_honours_source_date_epoch() -> None:
    assert forms.now_at({"SOURCE_DATE_EPOCH": "0"}) == "1970-01-01T00:00:00Z"
    assert forms.now_at({"SOURCE_DATE_EPOCH": "1700000000"}) == "2023-11-14T22:13:20Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", forms.now_at({}))


def test_the_default_actor_is_the_login_name() -> None:
    assert forms.default_actor({"LOGNAME": "ada", "USER": "bob"}) == "ada"
    assert forms.default_actor({"USER": "bob"}) == "bob"
    assert forms.default_actor({"LOGNAME": "bad\x01", "USER": "bob"}) == "bob"


@given(st.binary(max_size=64))
def test_attempt_files_are_named_by_their_digest(data: bytes) -> None:
    name = forms.StatePaths.blob(data)
    assert name == f"sha256-{digest.of_bytes(data)[7:]}.json"


@pytest.mark.parametrize(
    ("note", "label"),
    [
        ("refused: would exceed max_bytes by 1", "refused: max_bytes"),
        ("refused: would exceed max_instances by 3", "refused: max_instances"),
        ("refused: a record would exceed max_payload_bytes (4096)", "refused: max_payload_bytes"),
        ("refused: cut off after an earlier refusal in stage people", "refused"),
        ("exit 1", None),
        (None, None),
    ],
)
def test_the_report_labels_a_refusal_by_its_bound(note: str | None, label: str | None) -> None:
    assert refused_label(note) == label
