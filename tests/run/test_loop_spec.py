"""crucible.run.loop._spec: the loop member read into a LoopSpec, the phases
around the body, and the keep / target rules (docs/spec/loop.md)."""

from __future__ import annotations

from typing import Any

import pytest

from crucible.core.errors import InputRefused
from crucible.core.plan import Plan
from crucible.run.loop._spec import LoopSpec, revision_key, revision_of


def plan(**loop: Any) -> Plan:
    tasks = [
        {"name": n, "kind": "command"} for n in ("seed", "propose", "evaluate", "report", "side")
    ]
    member: dict[str, Any] = {
        "body": ["propose", "evaluate"],
        "score": "evaluate",
        "metric": "score",
    }
    member.update({"max_revisions": 5, **loop})
    return Plan.from_json({"version": 3, "edition": 4, "tasks": tasks, "loop": member})


NEEDS = {
    "seed": (),
    "propose": ("seed",),
    "evaluate": ("propose",),
    "report": ("evaluate",),
    "side": (),
}


def test_a_plan_without_a_loop_has_none() -> None:
    assert LoopSpec.from_plan(Plan.from_json({"version": 3, "edition": 4, "tasks": []})) is None


def test_defaults_and_phases() -> None:
    spec = LoopSpec.from_plan(plan())
    assert spec is not None
    assert spec.body == ("evaluate", "propose")
    assert (spec.direction, spec.min_delta, spec.history_bytes) == ("max", 0.0, 65536)
    assert spec.target is None and spec.patience is None and spec.time_budget is None
    phases = spec.phases(NEEDS)
    assert phases.before == {"seed"} and phases.after == {"report"}


@pytest.mark.parametrize(
    ("direction", "min_delta", "score", "kept", "better"),
    [
        ("max", 0, 0.5, None, True),  # the first passed revision is always kept
        ("max", 0, 0.5, 0.5, False),  # with 0, strictly better
        ("max", 0, 0.51, 0.5, True),
        ("max", 0.1, 0.55, 0.5, False),  # below min_delta: noise
        ("max", 0.1, 0.6, 0.5, True),
        ("min", 0, 0.4, 0.5, True),
        ("min", 0.2, 0.4, 0.5, False),
        ("min", 0, 0.6, 0.5, False),
    ],
)
def test_better(
    direction: str, min_delta: float, score: float, kept: float | None, better: bool
) -> None:
    spec = LoopSpec.from_plan(plan(direction=direction, min_delta=min_delta))
    assert spec is not None and spec.better(score, kept) is better


def test_reached() -> None:
    up = LoopSpec.from_plan(plan(target=0.9))
    down = LoopSpec.from_plan(plan(target=2, direction="min"))
    assert up is not None and down is not None
    assert up.reached(0.9) and not up.reached(0.89)
    assert down.reached(2) and down.reached(1.5) and not down.reached(2.5)
    none = LoopSpec.from_plan(plan())
    assert none is not None and not none.reached(1e9)


@pytest.mark.parametrize(
    ("loop", "where"),
    [
        ({"score": "report"}, "score"),
        ({"max_revisions": 0}, "max_revisions"),
        ({"max_revisions": 10001}, "max_revisions"),
        ({"patience": 0}, "patience"),
        ({"min_delta": -1}, "min_delta"),
        ({"time_budget": 0}, "time_budget"),
        ({"direction": "up"}, "direction"),
        ({"body": []}, "body"),
        ({"body": ["nope", "evaluate"]}, "body"),
    ],
)
def test_a_hand_edited_loop_is_refused_naming_the_member(loop: dict[str, Any], where: str) -> None:
    with pytest.raises(InputRefused) as err:  # the model's refusals, or the spec's
        LoopSpec.from_plan(plan(**loop))
    assert err.value.where == f"plan:$.loop.{where}"


def test_revision_keys() -> None:
    assert revision_key(3) == "@rev3"
    assert revision_of("@rev12") == 12
    for key in (None, "3", "@rev", "@rev0", "@rev01", "@rev-1", "@rev1x", "@rev١"):
        assert revision_of(key) is None
