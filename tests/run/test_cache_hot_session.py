"""The session log's event time is formatted once per second (issue 15: every
event carries one), and stays what ``datetime.fromtimestamp`` gives, rounding
included."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from crucible.run.session._log import now_text


def _reference(t: float) -> str:
    moment = datetime.fromtimestamp(t, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@pytest.mark.parametrize(
    "t",
    [0.0, 1.0, 1.9995, 1.9999995, 1764650000.0004995, 1764650000.9999995, 1764650000.9995,
     123.4565, 999999999.9999999, 4102444800.5],
)  # fmt: skip
def test_now_text_at_the_edges(t: float) -> None:
    assert now_text(t) == _reference(t)


def test_now_text_over_many_times_in_any_order() -> None:
    rng = random.Random(15)
    times = [rng.uniform(0, 4e9) for _ in range(20000)]
    times += [1764650000.0 + k * 1e-4 for k in range(-3000, 3000)]  # within and across seconds
    rng.shuffle(times)
    assert [now_text(t) for t in times] == [_reference(t) for t in times]


def test_now_text_now_is_current() -> None:
    before = _reference(datetime.now(UTC).timestamp())[:19]
    text = now_text()
    after = _reference(datetime.now(UTC).timestamp())[:19]
    assert before <= text[:19] <= after and text.endswith("Z") and len(text) == 24
