"""Fuzz the report over mutated state (issue 12 item 18): whatever a session
line or a result record holds, the report renders every output or refuses
with a CrucibleError (one line, its exit code), never another exception."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crucible.core import canon
from crucible.core.errors import CrucibleError
from crucible.run.report import _report as report
from crucible.run.report import _timeline as timeline
from tests.run.dispatchtests import fanout_run

REPO = Path(__file__).resolve().parents[2]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = [
    "event", "session", "time", "task", "key", "attempt", "status", "note", "exit_code",
    "duration", "output_bytes", "files_bytes", "instances", "retry", "log", "stderr_tail",
    "cached", "tolerated", "format", "keys", "counts", "extra", "retryable",
]  # fmt: skip


@pytest.fixture(scope="module")
def fanout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fanout_run(tmp_path_factory.mktemp("fuzz") / "s", fail_on="beta")


def _render_everything(state: Path) -> None:
    for task in (None, "measure"):
        try:
            rows = report.collect(state, task)
        except CrucibleError as exc:
            assert exc.exit_code in (1, 2, 3), exc
            assert "\n" not in str(exc) or exc.where, exc
            return
        out = io.StringIO()
        report.render_table(rows, out, instances=task is not None)
        for r in rows:
            canon.dumps(report.row_json(r))
        timeline.render_report(rows, "fuzz")


def _mutate(value: dict[str, Any], field: str, new: Any, delete: bool) -> None:
    if delete:
        value.pop(field, None)
    else:
        value[field] = new


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    index=st.integers(min_value=0, max_value=40),
    field=st.sampled_from(FIELDS),
    new=json_values,
    delete=st.booleans(),
)
def test_mutated_session_line(fanout: Path, index: int, field: str, new: Any, delete: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "s"
        shutil.copytree(fanout, state, symlinks=True)
        lines = [json.loads(x) for x in (state / "session.jsonl").read_bytes().splitlines()]
        _mutate(lines[index % len(lines)], field, new, delete)
        (state / "session.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
        _render_everything(state)


RECORDS = ["list.json", "measure.json", "measure/1.json", "measure/3.json", "total.json"]


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(RECORDS),
    field=st.sampled_from(FIELDS),
    new=json_values,
    delete=st.booleans(),
)
def test_mutated_result_record(fanout: Path, name: str, field: str, new: Any, delete: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "s"
        shutil.copytree(fanout, state, symlinks=True)
        task, _, key = name.removesuffix(".json").partition("/")
        if not key:
            path = state / "results" / name
            record = json.loads(path.read_bytes())
            _mutate(record, field, new, delete)
            path.write_bytes(orjson.dumps(record))
        else:  # an instance's record: its line of the packed results/<task>.jsonl
            path = state / "results" / f"{task}.jsonl"
            lines = path.read_bytes().splitlines()
            at = next(i for i, x in enumerate(lines) if json.loads(x)["key"] == key)
            record = json.loads(lines[at])
            _mutate(record, field, new, delete)
            lines[at] = orjson.dumps(record)
            path.write_bytes(b"\n".join(lines) + b"\n")
        _render_everything(state)
