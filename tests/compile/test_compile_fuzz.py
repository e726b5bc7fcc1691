"""Arbitrary manifest documents never crash the compiler: each is compiled or refused
with diagnostics (or an UnsupportedVersion for a bad edition)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.compile._locate import FileLocator
from crucible.compile._manifest import analyze_document
from crucible.core import canon
from crucible.core.errors import UnsupportedVersion

KEYS = [
    "name",
    "kind",
    "run",
    "needs",
    "join",
    "emits",
    "emits_files",
    "map",
    "retries",
    "timeout",
    "prompt",
    "description",
    "epilogue",
    "env",
    "inputs",
    "colour",
]
WORDS = [
    "a",
    "b",
    "a.x",
    "b.y",
    "x",
    "command",
    "agent",
    "evaluate",
    "all",
    "settled",
    "string",
    "array",
    "object",
    "integer",
    "params.k",
    "",
    "..",
    "@v",
    "item",
]

scalars = st.one_of(
    st.sampled_from(WORDS),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.just(datetime.date(1979, 5, 27)),
    st.text(max_size=5),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from([*WORDS, "v", "k"]), inner, max_size=4),
    ),
    max_leaves=12,
)
tasks = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)
docs = st.fixed_dictionaries(
    {
        "workflow": st.fixed_dictionaries(
            {"name": st.one_of(st.just("w"), values), "task": st.lists(tasks, max_size=4)},
            optional={
                "params": st.dictionaries(
                    st.sampled_from(["k", "p", "a b"]),
                    st.one_of(
                        values,
                        st.fixed_dictionaries(
                            {"type": st.sampled_from(["string", "integer", "any", "x"])},
                            optional={"default": values},
                        ),
                    ),
                ),
                "description": values,
            },
        )
    },
    optional={"edition": st.one_of(st.sampled_from([1, 2, 3]), values)},
)


@settings(max_examples=200, deadline=None)
@given(docs)
def test_any_document_is_compiled_or_refused(doc: dict[str, Any]) -> None:
    try:
        analysis = analyze_document(doc, FileLocator("f.toml"), "f.toml", Path("."))
    except UnsupportedVersion:
        return
    if analysis.compiled is None:
        assert analysis.errors
        for d in analysis.errors:
            assert d.code and d.message and "\n" not in d.code
    else:
        assert not analysis.errors
        assert canon.loads(analysis.compiled.data) == analysis.compiled.plan
        # the fast canonical path equals the exact one
        assert analysis.compiled.data == canon.dumps(analysis.compiled.plan)


REPO = Path(__file__).resolve().parents[2]
PLAN = canon.loads((REPO / "tests/compile/packs/v2-inputs/golden.plan.json").read_bytes())
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**53) + 1, 2**53 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(WORDS),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(WORDS), inner, max_size=3)
    ),
    max_leaves=8,
)


def _containers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _containers(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _containers(v, (*path, i))
    return out


PATHS = [p for p in _containers(PLAN) if p]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(PATHS), st.one_of(st.none(), json_values)), min_size=1, max_size=3
    )
)
def test_any_mutated_plan_is_loaded_or_refused(edits: list[tuple[tuple[Any, ...], Any]]) -> None:
    from crucible.compile import load_plan_bytes
    from crucible.core.errors import CrucibleError

    plan = canon.loads(canon.dumps(PLAN))
    for path, value in edits:
        parent: Any = plan
        try:
            for part in path[:-1]:
                parent = parent[part]
            if value is None and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    try:
        loaded = load_plan_bytes(canon.dumps(plan), "plan.json")
    except CrucibleError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert loaded.plan == plan
    assert loaded.data == canon.dumps(plan)
