"""Arbitrary ``[loop]`` tables and mutated loop plans never crash the compiler:
each is compiled or refused with diagnostics (issue 18; the fuzzing of
test_compile_fuzz.py, aimed at the loop member)."""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.compile import load_plan_bytes
from crucible.compile._locate import FileLocator
from crucible.compile._loop import LOOP_KEYS
from crucible.compile._manifest import analyze_document
from crucible.core import canon
from crucible.core.errors import CrucibleError

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "tests" / "compile" / "packs" / "loop-full"
DOC = tomllib.loads((PACK / "pack.toml").read_text())
PLAN = canon.loads((PACK / "golden.plan.json").read_bytes())
NAMES = ["prepare", "propose", "score", "publish", "beside", "wrap-up", "ghost", "loss", "words"]

scalars = st.one_of(
    st.sampled_from([*NAMES, "max", "min", "", "a b"]),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.just(datetime.date(1979, 5, 27)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)
    ),
    max_leaves=8,
)
tables = st.one_of(
    values, st.dictionaries(st.sampled_from([*LOOP_KEYS, "colour"]), values, max_size=10)
)


@settings(max_examples=300, deadline=None)
@given(tables)
def test_any_loop_table_is_compiled_or_refused(table: Any) -> None:
    doc = {**DOC, "loop": table}
    analysis = analyze_document(doc, FileLocator("f.toml"), "f.toml", Path("."))
    if analysis.compiled is None:
        assert analysis.errors
        for d in analysis.errors:
            assert d.code and d.message and "\n" not in d.message
            assert d.location.path is not None and d.location.path.startswith("$.loop")
        return
    assert not analysis.errors
    loop = analysis.compiled.plan["loop"]
    assert loop["body"] == sorted(loop["body"]) and loop["score"] in loop["body"]
    # what compiles reads back as a plan file, with the same digest
    assert load_plan_bytes(analysis.compiled.data, "plan.json").digest == analysis.compiled.digest


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**53) + 1, 2**53 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([*NAMES, "max", "min"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([*LOOP_KEYS, "colour"]), st.one_of(st.none(), json_values)),
        min_size=1,
        max_size=3,
    )
)
def test_any_mutated_loop_member_is_loaded_or_refused(edits: list[tuple[str, Any]]) -> None:
    plan = canon.loads(canon.dumps(PLAN))
    for key, value in edits:
        if value is None:
            plan["loop"].pop(key, None)
        else:
            plan["loop"][key] = value
    try:
        loaded = load_plan_bytes(canon.dumps(plan), "plan.json")
    except CrucibleError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert loaded.plan == plan


@st.composite
def dags_and_bodies(draw: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """A random DAG (edges only from earlier to later tasks) and a non-empty body."""
    n = draw(st.integers(min_value=1, max_value=9))
    names = [f"t{i}" for i in range(n)]
    tasks = [
        {
            "name": name,
            "needs": draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else [],
            "kind": "evaluate",
            "epilogue": False,
            "emits": {"s": "number"},
        }
        for i, name in enumerate(names)
    ]
    body = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    return tasks, body


@settings(max_examples=400, deadline=None)
@given(dags_and_bodies())
def test_the_sub_dag_rule_is_convexity(case: tuple[list[dict[str, Any]], list[str]]) -> None:
    """loop-not-subdag exactly when some task outside the body has a body task
    among its ancestors and another among its descendants (networkx decides)."""
    import networkx as nx

    from crucible.compile._checker import Checker
    from crucible.compile._loop import check_loop_graph

    tasks, body = case
    graph = nx.DiGraph()
    graph.add_nodes_from(t["name"] for t in tasks)
    graph.add_edges_from((need, t["name"]) for t in tasks for need in t["needs"])
    between = [
        x
        for x in graph
        if x not in body
        and nx.ancestors(graph, x) & set(body)
        and nx.descendants(graph, x) & set(body)
    ]
    chk = Checker(FileLocator("plan.json"))
    loop = {"body": sorted(body), "score": body[0], "metric": "s"}
    check_loop_graph(chk, loop, tasks)
    codes = [d.code for d in chk.diagnostics]
    assert codes == (["loop-not-subdag"] if between else [])
    if between:
        assert any(f"{x!r} is outside the body" in chk.diagnostics[0].message for x in between)
