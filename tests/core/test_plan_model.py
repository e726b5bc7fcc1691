"""The typed plan model (crucible.core.plan): every golden plan round-trips byte for
byte, defaults live in the model, unknown members are refused where they are."""

from __future__ import annotations

import copy
import gc
import pickle
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon, structs
from crucible.core.contract import (
    IR_VERSION_OF_EDITION,
    SUPPORTED_EDITIONS,
    SUPPORTED_VERSIONS,
    TASK_KEYS_SINCE,
)
from crucible.core.errors import InputRefused, UnsupportedVersion
from crucible.core.plan import (
    PLAN_MEMBERS,
    TASK_MEMBERS,
    WORKFLOW_MEMBERS,
    Axis,
    Expression,
    Input,
    ItemsSource,
    Matrix,
    ParamSource,
    Plan,
    PlanShapeError,
    Ref,
    Resources,
    Retry,
    SequenceSource,
    Task,
    _plainly_sound,
    _task_checked,
    parse,
    split_ref,
)

REPO = Path(__file__).resolve().parents[2]
GOLDEN = sorted(
    p
    for p in REPO.glob("**/golden*.json")
    if ".venv" not in p.parts and b'"tasks":' in p.read_bytes()[:200_000]
)
EVERY = REPO / "tests/compile/packs/every-member/golden.plan.json"


def test_there_are_golden_plans() -> None:
    assert len(GOLDEN) >= 19 and EVERY in GOLDEN


@pytest.mark.parametrize("path", GOLDEN, ids=[str(p.relative_to(REPO)) for p in GOLDEN])
@pytest.mark.parametrize("checked", [False, True], ids=["strict", "checked"])
def test_a_golden_plan_round_trips_byte_for_byte(path: Path, checked: bool) -> None:
    data = path.read_bytes()
    plan = Plan.from_json(canon.loads(data), checked=checked)
    assert canon.dumps(plan.to_json()) == data
    # the model is a value: reading its own JSON gives it back
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize("path", GOLDEN, ids=[str(p.relative_to(REPO)) for p in GOLDEN])
def test_a_checked_plan_is_the_plan_the_strict_reader_builds(path: Path) -> None:
    """The checked reader sets only the members a task has (the rest read their
    class defaults): the same values, and the same after a pickle (a Dask or
    SLURM node is sent the model)."""
    raw = canon.loads(path.read_bytes())
    checked = Plan.from_json(raw, checked=True)
    assert checked == Plan.from_json(raw)
    again = pickle.loads(pickle.dumps(checked))
    assert again == checked and canon.dumps(again.to_json()) == canon.dumps(raw)
    for task in checked.tasks:
        assert structs.replace(task) == task


def test_the_every_member_pack_holds_every_member() -> None:
    """So the round trip above covers each member at least once; a key added to the
    model without adding it to that pack fails here."""
    raw = canon.loads(EVERY.read_bytes())
    task_keys = {k for t in raw["tasks"] for k in t}
    assert task_keys == set(TASK_MEMBERS)
    # resolved_from: a Starlark pack's; limits and record: an accounted pack's
    assert set(raw["workflow"]) == set(WORKFLOW_MEMBERS) - {"resolved_from", "limits", "record"}
    accounted = canon.loads((REPO / "tests/compile/packs/accounted/golden.plan.json").read_bytes())
    assert {"limits", "record"} <= set(accounted["workflow"])
    assert Plan.from_json(accounted).workflow.accounted
    assert set(raw) == set(PLAN_MEMBERS)
    kinds = {type(Task.from_json(t, "", 3, checked=True).map) for t in raw["tasks"]}
    assert {Ref, ItemsSource, ParamSource, SequenceSource} <= kinds


def test_the_task_members_are_the_contracts_and_the_models_fields() -> None:
    """One table (core.contract.TASK_KEYS_SINCE) says which task keys exist and
    the edition of each; the model has a field for each, and nothing more, and
    compile's keys per IR version are the same table's."""
    from crucible.compile._editions import EDITION_CONTROL, PLAN_TASK_KEYS, ir_version_for

    assert set(TASK_MEMBERS) == set(TASK_KEYS_SINCE) == {f.name for f in structs.fields(Task)}
    for edition in SUPPORTED_EDITIONS:
        assert ir_version_for(edition) == IR_VERSION_OF_EDITION[edition]
        assert PLAN_TASK_KEYS[ir_version_for(edition)] >= {
            k for k, since in TASK_KEYS_SINCE.items() if since <= edition
        }
    assert IR_VERSION_OF_EDITION[EDITION_CONTROL] == max(SUPPORTED_VERSIONS)
    for version, keys in PLAN_TASK_KEYS.items():
        assert keys == {k for k, since in TASK_MEMBERS.items() if since <= version}, version


@pytest.mark.parametrize("path", GOLDEN, ids=[str(p.relative_to(REPO)) for p in GOLDEN])
def test_a_golden_plan_holds_the_members_of_its_version(path: Path) -> None:
    raw = canon.loads(path.read_bytes())
    version = raw["version"]
    assert version == IR_VERSION_OF_EDITION[raw.get("edition", 1)]
    for task in raw["tasks"]:
        assert all(TASK_MEMBERS[k] <= version for k in task), task["name"]
    newer = [k for k, since in TASK_MEMBERS.items() if since > version]
    for key in newer[:1]:  # a member of a newer version is refused at that version
        task = {**raw["tasks"][0], key: None}
        with pytest.raises(PlanShapeError, match=f"unknown member {key!r}"):
            Plan.from_json({**raw, "tasks": [task]})


def test_defaults_are_applied_by_the_model() -> None:
    plan = Plan.from_json(
        {"version": 1, "tasks": [{"name": "a", "kind": "command", "run": "true"}]}
    )
    t = plan.task("a")
    assert plan.edition == 1 and plan.workflow.name == "" and plan.loop is None
    assert (t.needs, t.join, dict(t.emits), t.emits_files, t.retries, t.epilogue) == (
        (),
        "all",
        {},
        (),
        0,
        False,
    )
    assert t.timeout is None and t.retry is None and t.map is None and t.matrix is None
    assert t.on_failure == "fail" and not t.tolerated and t.caches and t.params is None
    assert not t.fans_out and not t.listed and t.map_ref is None


def test_what_the_members_mean() -> None:
    t = Task.from_json(
        {
            "name": "t",
            "kind": "command",
            "run": ["x"],
            "map": {"sequence": {"count": 3, "start": 2, "step": -2}},
            "cache": False,
            "on_failure": "continue",
            "resources": {"cpus": 2},
        },
        "$.tasks[0]",
        3,
    )
    assert t.run == ("x",) and t.fans_out and t.listed and not t.caches and t.tolerated
    assert t.map == SequenceSource(start=2, step=-2, count=3)
    assert t.resources == Resources(cpus=2) and t.resources.amounts() == {"cpus": 2}
    keyed = Task.from_json(
        {"name": "k", "kind": "command", "run": "x", "map": "p.f", "key": "id"}, "", 3
    )
    assert keyed.map_ref == Ref("p", "f") and keyed.listed
    assert not Task.from_json({"name": "m", "kind": "command", "map": "p.f"}, "", 1).listed
    pathed = Task.from_json({"name": "m", "kind": "command", "map": "p.f[0]"}, "", 3)
    assert pathed.map_ref == Ref("p", "f", (0,)) and pathed.listed  # the dispatcher resolves it


def test_references_are_read_by_the_one_parser_with_the_needs() -> None:
    """A dotted producer is the longest prefix that names a need (core.refs)."""
    t = Task.from_json(
        {
            "name": "c",
            "kind": "command",
            "needs": ["a.b"],
            "map": "a.b.rows",
            "inputs": {
                "x": {"from": "a.b.cfg.region", "producer": "a.b", "field": "cfg",
                      "path": ["region"], "type": "any"},
            },
        },
        "$.tasks[0]",
        3,
    )  # fmt: skip
    assert t.map_ref == Ref("a.b", "rows")
    assert t.inputs["x"].ref == Ref("a.b", "cfg", ("region",))
    assert t.to_json()["inputs"]["x"]["path"] == ["region"]


def test_plan_lookups() -> None:
    plan = Plan.from_json(canon.loads(EVERY.read_bytes()))
    assert plan.order[0] == "seed" and plan.task("sum").join == "settled"
    assert plan.listed("again") and not plan.task("again").listed  # a map over a map
    assert not plan.listed("each") and plan.listed("seq")
    assert plan.workflow.outputs["first"] == Ref("seed", "rows", (0,))
    assert plan.workflow.outputs["doubled"] == Expression("tasks.sum.total * 2")
    each = plan.task("each")
    assert each.retry is not None and each.retry.when == "last.exit_code == 75"
    assert plan.task("countdown").map == SequenceSource(start=ParamSource("top"), step=-1, end=1)
    assert plan.task("seq").map == SequenceSource(start=1, step=2, count=4, format="%02d")
    # the params a fan-out reads reach each instance as its item, not whole
    assert plan.task("grid").fanout_params == {"names"}
    assert plan.task("counted").fanout_params == {"names"}
    assert plan.task("countdown").fanout_params == {"top"}
    assert plan.task("seq").fanout_params == frozenset() == plan.task("sum").fanout_params
    with pytest.raises(InputRefused, match="'nope' is not in the plan"):
        plan.task("nope")
    assert plan.workflow.outputs["total"] == Ref("sum", "total")
    assert plan.workflow.publish["reports"].split() == (("sum", "report/*.md"),)
    assert plan.workflow.defaults()["names"] == ["a", "b"]
    assert "token" not in plan.workflow.defaults()
    assert plan.task("sum").inputs["parts"] == Input(Ref("each", "part"), "integer")


@pytest.mark.parametrize(
    ("plan", "path", "message"),
    [
        ({"version": 1, "tasks": [], "extra": 1}, "$.extra", "unknown member 'extra'"),
        ({"version": 2, "tasks": [], "loop": {}}, "$.loop", "unknown member 'loop'"),
        (
            {"version": 1, "tasks": [{"name": "a", "kind": "command", "when": "x"}]},
            "$.tasks[0].when",
            "unknown member 'when' in a version 1 plan task",
        ),
        (
            {"version": 3, "edition": 4, "tasks": [{"name": "a", "kind": "job"}]},
            "$.tasks[0].kind",
            "unknown kind 'job'",
        ),
        (
            {"version": 3, "edition": 4, "tasks": [{"name": "a", "kind": "agent", "timeout": "1"}]},
            "$.tasks[0].timeout",
            "timeout must be a number",
        ),
        (
            {"version": 3, "edition": 4, "tasks": [{"name": "a", "kind": "command", "map": "x"}]},
            "$.tasks[0].map",
            r"expected 'producer\.field', got 'x'",
        ),
        (
            {
                "version": 3,
                "edition": 4,
                "tasks": [{"name": "a", "kind": "command", "retry": {"limit": 1, "tries": 2}}],
            },
            "$.tasks[0].retry.tries",
            "unknown member 'tries' in retry",
        ),
        (
            {
                "version": 2,
                "edition": 3,
                "tasks": [
                    {
                        "name": "a",
                        "kind": "command",
                        "inputs": {"x": {"from": "p.f", "producer": "q", "field": "f"}},
                    }
                ],
            },
            "$.tasks[0].inputs.x",
            "producer/field/path disagree",
        ),
        ({"version": 1, "workflow": {"name": 3}, "tasks": []}, "$.workflow.name", "a string"),
    ],
)
def test_a_bad_member_is_refused_at_its_path(plan: Any, path: str, message: str) -> None:
    with pytest.raises(PlanShapeError, match=message) as info:
        Plan.from_json(plan)
    assert info.value.location.path == path and info.value.location.file == "plan"
    assert info.value.exit_code == 1


@pytest.mark.parametrize("bad", [{"version": 9, "tasks": []}, {"version": 1, "edition": 7}])
def test_an_unsupported_version_or_edition(bad: Any) -> None:
    with pytest.raises(UnsupportedVersion):
        Plan.from_json(bad)


# -- Ref: one parser -----------------------------------------------------------------

_FIELD = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,20}", fullmatch=True)


_PRODUCER = st.from_regex(r"[A-Za-z0-9_-]{1,8}(\.[A-Za-z0-9_-]{1,8}){0,2}", fullmatch=True)
_STEPS = st.lists(st.integers(0, 99) | _FIELD, max_size=3).map(tuple)


@given(producer=_PRODUCER, field=_FIELD, path=_STEPS)
def test_a_ref_round_trips(producer: str, field: str, path: tuple[int | str, ...]) -> None:
    ref = Ref(producer, field, path)
    assert parse(ref.text, tasks=[producer]) == ref
    assert split_ref(ref.text, [producer]) == (producer, field)


@pytest.mark.parametrize("text", ["", "a", ".f", "a.", "a.b[x]", 3, None])
def test_a_bad_ref_is_refused(text: object) -> None:
    assert not isinstance(text, str) or split_ref(text) is None
    with pytest.raises(PlanShapeError, match=r"expected 'producer\.field'") as info:
        parse(text, "$.x")
    assert info.value.location.path == "$.x"


# -- hypothesis: any task the model can hold round-trips -----------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_NAMES = st.lists(_FIELD, max_size=3, unique=True).map(tuple)
_NUM = st.integers(1, 1000) | st.floats(0.001, 1e6, allow_nan=False, allow_infinity=False)
_SOURCE = st.one_of(
    st.builds(Ref, _FIELD, _FIELD),
    st.builds(ItemsSource, st.lists(_JSON, max_size=3)),
    st.builds(ParamSource, _FIELD),
    st.builds(
        SequenceSource,
        start=st.integers(-9, 9) | st.builds(ParamSource, _FIELD),
        step=st.sampled_from([-2, 1, 3]),
        count=st.integers(0, 9),
        format=st.none() | st.just("%02d"),
    ),
    st.builds(
        SequenceSource,
        start=st.integers(-9, 9),
        step=st.just(-1),
        end=st.builds(ParamSource, _FIELD),
    ),
)


@st.composite
def _tasks(draw: st.DrawFn) -> Task:
    kind: Literal["command", "evaluate", "agent"] = draw(
        st.sampled_from(["command", "evaluate", "agent"])
    )
    fan = draw(st.sampled_from(["none", "map", "matrix"]))
    return Task(
        name=draw(_FIELD),
        kind=kind,
        needs=draw(_NAMES),
        join=draw(st.sampled_from(["all", "settled"])),
        emits=draw(
            st.dictionaries(_FIELD, st.sampled_from(["string", "any", "array"]), max_size=3)
        ),
        emits_files=draw(_NAMES),
        retries=draw(st.integers(0, 1000)),
        epilogue=draw(st.booleans()),
        run=None if kind == "agent" else draw(st.text(min_size=1) | _NAMES.filter(bool)),
        prompt=draw(st.text(min_size=1)) if kind == "agent" else None,
        map=draw(_SOURCE) if fan == "map" else None,
        matrix=draw(
            st.builds(
                Matrix,
                st.lists(st.builds(Axis, _FIELD, _SOURCE), min_size=1, max_size=2).map(tuple),
                st.lists(st.dictionaries(_FIELD, _JSON, min_size=1, max_size=2), max_size=2).map(
                    tuple
                ),
                st.lists(st.dictionaries(_FIELD, _JSON, min_size=1, max_size=2), max_size=2).map(
                    tuple
                ),
            )
        )
        if fan == "matrix"
        else None,
        timeout=draw(st.none() | _NUM),
        description=draw(st.none() | st.text(max_size=5)),
        env=draw(_NAMES),
        inputs=draw(
            st.dictionaries(
                _FIELD, st.builds(Input, st.builds(Ref, _FIELD, _FIELD), st.just("any")), max_size=2
            )
        ),
        when=draw(st.none() | st.text(min_size=1, max_size=5)),
        on_failure=draw(st.sampled_from(["fail", "continue"])),
        allow_exit=draw(st.lists(st.integers(1, 255), max_size=3, unique=True).map(tuple)),
        retry=draw(
            st.none()
            | st.builds(
                Retry,
                st.integers(0, 1000),
                _NUM,
                _NUM,
                _NUM,
                st.booleans(),
                st.none() | st.lists(st.integers(1, 255), min_size=1, max_size=3).map(tuple),
            )
        ),
        deadline=draw(st.none() | _NUM),
        key=draw(st.none() | _FIELD),
        parallelism=draw(st.none() | st.integers(1, 100_000)),
        cache=draw(st.none() | st.booleans()),
        params=draw(st.none() | _NAMES),
        resources=draw(
            st.none() | st.builds(Resources, *(st.none() | st.integers(1, 2**40) for _ in range(3)))
        ),
        reads=draw(_NAMES),
        sandbox=draw(st.booleans()),
        network=draw(st.booleans()),
    )


@settings(max_examples=150, deadline=None)
@given(tasks=st.lists(_tasks(), min_size=1, max_size=3))
def test_any_task_round_trips_through_canonical_bytes(tasks: list[Task]) -> None:
    plan = Plan(
        3, 4, Plan.from_json({"version": 3, "edition": 4, "tasks": []}).workflow, tuple(tasks)
    )
    data = canon.dumps(plan.to_json())
    again = Plan.from_json(canon.loads(data))
    assert again == plan and canon.dumps(again.to_json()) == data
    assert Plan.from_json(canon.loads(data), checked=True) == plan


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_a_checked_plan_leaves_the_collector_as_it_was(enabled: bool) -> None:
    """The checked reader pauses cyclic collection while it builds the tasks and
    restores it on every exit, a refused plan's included."""
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        Plan.from_json(canon.loads(EVERY.read_bytes()), checked=True)
        assert gc.isenabled() is enabled
        with pytest.raises(KeyError):
            bad = {"name": "a", "kind": "command", "needs": [], "inputs": {"x": {}}}
            Plan.from_json({"version": 3, "edition": 4, "tasks": [bad]}, checked=True)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_one_reference_text_read_from_two_producers_is_two_inputs() -> None:
    """``a.b.c`` is field ``c`` of task ``a.b`` for a task that needs ``a.b``, and
    member ``c`` of field ``b`` of task ``a`` for one that needs ``a``: the
    checked reader shares an input only when its producer is the same too."""

    def reader(name: str, need: str, producer: str, field: str, path: list[str]) -> Any:
        spec: dict[str, Any] = {
            "from": "a.b.c",
            "producer": producer,
            "field": field,
            "type": "any",
        }
        if path:
            spec["path"] = path
        return {**_task_json(name), "needs": [need], "inputs": {"x": spec}}

    raw = {
        "version": 3,
        "edition": 4,
        "workflow": {"name": "w", "params": {}},
        "tasks": [
            {**_task_json("a"), "emits": {"b": "object"}},
            {**_task_json("a.b"), "emits": {"c": "any"}},
            reader("x", "a.b", "a.b", "c", []),
            reader("y", "a", "a", "b", ["c"]),
        ],
    }
    checked = Plan.from_json(raw, checked=True)
    assert checked == Plan.from_json(raw)
    assert checked.task("x").inputs["x"].ref == Ref("a.b", "c")
    assert checked.task("y").inputs["x"].ref == Ref("a", "b", ("c",))


def _task_json(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "command",
        "run": "true",
        "needs": [],
        "join": "all",
        "emits": {},
        "emits_files": [],
        "retries": 0,
        "epilogue": False,
    }


# -- the strict reader's quick path: the located reader's tasks, exactly -------------

_PLAIN_TASKS = [
    (raw["version"], t)
    for raw in (canon.loads(p.read_bytes()) for p in GOLDEN)
    for t in raw["tasks"]
    if _plainly_sound(t, raw["version"], {})
]
_MUTANTS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 2)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "a", "a.b", "a.b.c", "a[0]", "a.items", "any", "all", "command"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
_KEYS = st.sampled_from([*sorted(TASK_MEMBERS), "from", "producer", "field", "type", "path"])


@st.composite
def _near_plain_tasks(draw: st.DrawFn) -> tuple[int, dict[str, Any]]:
    version, task = draw(st.sampled_from(_PLAIN_TASKS))
    task = copy.deepcopy(task)
    for _ in range(draw(st.integers(0, 3))):
        inputs = task.get("inputs")
        target = task
        if isinstance(inputs, dict) and inputs and draw(st.booleans()):
            spec = inputs[draw(st.sampled_from(sorted(inputs)))]
            target = spec if isinstance(spec, dict) else task
        key = draw(_KEYS)
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(_MUTANTS)
    return version, task


def test_there_are_plain_tasks_to_mutate() -> None:
    assert len(_PLAIN_TASKS) >= 20
    assert any("inputs" in t for _, t in _PLAIN_TASKS) and any("map" in t for _, t in _PLAIN_TASKS)


@settings(max_examples=600, deadline=None)
@given(_near_plain_tasks())
def test_a_task_the_quick_check_passes_is_the_located_readers(case: tuple[int, Any]) -> None:
    """What the strict reader's quick path accepts, the located reader accepts
    too and reads as the same task; the rest is left to the located reader."""
    version, task = case
    if _plainly_sound(task, version, {}):
        assert _task_checked(task, version, {}) == Task.from_json(task, "$", version)
