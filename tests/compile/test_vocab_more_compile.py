"""Issue 32 items 4-7 at compile time: the include-only matrix, ``on_empty``,
sequences with ``format`` and params, ``retry.when`` — plan forms, normal form,
and refusals with a code and a location."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.compile import compile_bytes, compile_path, load_plan_bytes
from crucible.compile._diagnostics import ValidationFailed
from crucible.compile._manifest import analyze_manifest
from crucible.compile._sequences import format_problem
from crucible.core import canon

HEAD = """edition = 4
[workflow]
name = "v"
[workflow.params.n]
type = "integer"
default = 3
[workflow.params.word]
type = "string"
default = "x"
[workflow.params.anything]
type = "any"
"""


def plan_of(body: str, head: str = HEAD) -> dict[str, Any]:
    return compile_bytes((head + body).encode(), "pack.toml", Path(".")).plan


def codes(body: str, head: str = HEAD) -> list[tuple[str, str | None, str]]:
    analysis = analyze_manifest((head + body).encode(), "pack.toml", Path("."))
    return [(d.code, d.location.where(), d.message) for d in analysis.errors]


def task(body: str, name: str = "t", head: str = HEAD) -> dict[str, Any]:
    return next(t for t in plan_of(body, head)["tasks"] if t["name"] == name)


def one_task(lines: str) -> str:
    return f'[[workflow.task]]\nname = "t"\nrun = "true"\n{lines}\n'


def assert_refused(body: str, code: str, line: int, head: str = HEAD) -> str:
    found = codes(body, head)
    assert found and found[0][0] == code, found
    assert found[0][1] is not None and found[0][1].startswith(f"pack.toml:{line}:"), found
    return found[0][2]


def round_trips(body: str) -> None:
    """The plan passes the strict plan reader (normal form) with the same bytes."""
    plan = plan_of(body)
    data = canon.dumps(plan)
    assert load_plan_bytes(data, "plan.json").data == data


# -- item 4: the include-only matrix -------------------------------------------------


def test_an_include_only_matrix_compiles_to_no_axes_and_its_entries_in_order() -> None:
    body = one_task('matrix = { include = [{ os = "b", py = "3" }, { os = "a" }] }')
    assert task(body)["matrix"] == {"axes": [], "include": [{"os": "b", "py": "3"}, {"os": "a"}]}
    round_trips(body)


@pytest.mark.parametrize(
    ("lines", "code", "line"),
    [
        ("matrix = { include = [] }", "matrix-no-axes", 15),
        ("matrix = {}", "matrix-no-axes", 15),
        (
            'matrix = { include = [{ os = "a" }], exclude = [{ os = "a" }] }',
            "matrix-unknown-axis",
            15,
        ),
        ('matrix = { include = [{ os = "a" }, { os = "a" }] }', "duplicate-entry", 15),
        ("matrix = { include = [{ os = 1979-05-27 }] }", "bad-value", 15),
        ('matrix = { include = ["linux"] }', "wrong-type", 15),
        ('matrix = { include = "linux" }', "wrong-type", 15),
    ],
)
def test_include_only_matrix_refusals(lines: str, code: str, line: int) -> None:
    assert_refused(one_task(lines), code, line)


def test_a_repeated_include_entry_is_named_at_the_repeat() -> None:
    message = assert_refused(
        one_task("matrix = { include = [{ a = 1, b = 2 }, { c = 3 }, { b = 2, a = 1 }] }"),
        "duplicate-entry",
        15,
    )
    assert "include[2] repeats include[0]" in message


def test_an_include_only_matrix_is_refused_below_edition_4() -> None:
    head = HEAD.replace("edition = 4", "edition = 3").split("[workflow.params.n]")[0]
    found = codes(one_task('matrix = { include = [{ os = "a" }] }'), head)
    assert found[0][0] == "unknown-key" and "edition 4" in found[0][2], found


# -- item 5: on_empty -------------------------------------------------------------------


def test_on_empty_skip_is_kept_and_pass_is_omitted() -> None:
    body = one_task('map = "params.anything"\non_empty = "skip"')
    assert task(body)["on_empty"] == "skip"
    round_trips(body)
    assert "on_empty" not in task(one_task('matrix = { a = [1] }\non_empty = "pass"'))


@pytest.mark.parametrize(
    ("lines", "code", "line"),
    [
        ('on_empty = "skip"', "on-empty-needs-fanout", 15),
        ('on_empty = "pass"', "on-empty-needs-fanout", 15),
        ('map = [1]\non_empty = "never"', "bad-value", 16),
        ("map = [1]\non_empty = true", "wrong-type", 16),
        ('map = [1]\non_empty = ["skip"]', "wrong-type", 16),
    ],
)
def test_on_empty_refusals(lines: str, code: str, line: int) -> None:
    assert_refused(one_task(lines), code, line)


def test_on_empty_is_refused_below_edition_4() -> None:
    head = 'edition = 3\n[workflow]\nname = "v"\n'
    found = codes(one_task('on_empty = "skip"'), head)
    assert found[0][0] == "unknown-key" and "edition 4" in found[0][2], found


def test_a_plan_with_on_empty_pass_written_out_is_not_normal_form() -> None:
    plan = plan_of(one_task("map = [1]"))
    plan["tasks"][0]["on_empty"] = "pass"
    with pytest.raises(ValidationFailed) as caught:
        load_plan_bytes(canon.dumps(plan), "plan.json")
    assert [d.code for d in caught.value.diagnostics] == ["not-normal-form"]


# -- item 6: sequences ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "plan_form"),
    [
        (
            '{ start = 1, end = 12, format = "%02d" }',
            {"sequence": {"count": 12, "start": 1, "step": 1, "format": "%02d"}},
        ),
        ("{ start = 5, end = 1, step = -1 }", {"sequence": {"count": 5, "start": 5, "step": -1}}),
        (
            '{ count = "params.n" }',
            {"sequence": {"count": {"param": "n"}, "start": 0, "step": 1}},
        ),
        (
            '{ start = "params.n", end = 1, step = -1, format = "T-%d" }',
            {"sequence": {"end": 1, "start": {"param": "n"}, "step": -1, "format": "T-%d"}},
        ),
        (
            '{ start = 2, end = "params.n" }',
            {"sequence": {"end": {"param": "n"}, "start": 2, "step": 1}},
        ),
        (
            '{ start = "params.anything", count = 4, step = 3 }',
            {"sequence": {"count": 4, "start": {"param": "anything"}, "step": 3}},
        ),
        (
            '{ count = 2, format = "%%%x%%" }',
            {"sequence": {"count": 2, "start": 0, "step": 1, "format": "%%%x%%"}},
        ),
    ],
)
def test_sequences_compile_to_their_plan_form_and_read_back(spelling: str, plan_form: Any) -> None:
    body = one_task(f"map = {spelling}")
    assert task(body)["map"] == plan_form
    round_trips(body)
    axis = one_task(f"matrix = {{ a = {spelling} }}")
    assert task(axis)["matrix"]["axes"][0]["source"] == plan_form
    round_trips(axis)


@pytest.mark.parametrize(
    ("spelling", "code", "says"),
    [
        ('{ count = 3, format = "%s" }', "bad-value", "%s is not an integer conversion"),
        ('{ count = 3, format = "%.2f" }', "bad-value", "%f is not an integer conversion"),
        ('{ count = 3, format = "%c" }', "bad-value", "%c is not an integer conversion"),
        ('{ count = 3, format = "n" }', "bad-value", "exactly one integer conversion"),
        ('{ count = 3, format = "%d%d" }', "bad-value", "not 2"),
        ('{ count = 3, format = "50%" }', "bad-value", "lone '%'"),
        ('{ count = 3, format = "%0100d" }', "bad-value", "at most 64 wide"),
        ("{ count = 3, format = 2 }", "wrong-type", "format must be a string"),
        ("{ count = -1 }", "bad-value", "count must not be negative"),
        ("{ count = 3, step = 0 }", "bad-value", "step must not be 0"),
        ("{ start = 5, end = 1 }", "bad-value", "write step = -1"),
        ("{ start = 1, end = 5, step = -2 }", "bad-value", "write step = 2"),
        ('{ count = "n" }', "wrong-type", 'an integer or "params.NAME"'),
        ('{ count = 2, step = "params.n" }', "wrong-type", "step must be an integer"),
        ('{ count = "params.nope" }', "fanout-unknown-param", "params.nope"),
        ('{ end = "params.word" }', "sequence-not-integer", "declared string"),
        ('{ count = "params.bad-" }', "fanout-unknown-param", "params.bad-"),
        (
            "{ count = 3, colour = 1 }",
            "unknown-key",
            "a sequence takes count, start, end, step, format (found 'colour')",
        ),
        ("{ colour = 1 }", "bad-value", "a table must be a sequence"),
    ],
)
def test_sequence_refusals_are_located(spelling: str, code: str, says: str) -> None:
    message = assert_refused(one_task(f"map = {spelling}"), code, 15)
    assert says in message


def test_a_param_default_a_sequence_cannot_use_is_refused() -> None:
    head = HEAD + '[workflow.params.neg]\ntype = "integer"\ndefault = -2\n'
    head += '[workflow.params.odd]\ntype = "any"\ndefault = "x"\n'
    assert_refused(one_task('map = { count = "params.neg" }'), "bad-value", 21, head)
    assert_refused(one_task('map = { count = "params.odd" }'), "sequence-not-integer", 21, head)
    # a negative start is fine
    assert task(one_task('map = { start = "params.neg", count = 2 }'), head=head)


def test_a_task_listing_params_must_list_the_ones_its_sequence_reads() -> None:
    assert_refused(
        one_task('params = ["word"]\nmap = { count = "params.n" }'), "task-params-unread", 16
    )
    assert task(one_task('params = ["n"]\nmap = { count = "params.n" }'))


def test_a_sequence_format_is_refused_below_edition_4() -> None:
    head = 'edition = 3\n[workflow]\nname = "v"\n'
    found = codes(one_task('map = { count = 2, format = "%d" }'), head)
    assert found and found[0][0] == "wrong-type", found  # before edition 4 a map is a ref
    assert "needs edition 4" in found[0][2], found


# -- item 7: retry.when -------------------------------------------------------------------

RETRY_WHEN = "last.exit_code in (69, 75) or last.reason == 'timeout'"


def test_retry_when_is_kept_as_written_beside_the_defaults() -> None:
    body = one_task(f'retry = {{ limit = 3, when = "{RETRY_WHEN}" }}')
    assert task(body)["retry"] == {
        "limit": 3,
        "delay": 0.5,
        "factor": 2,
        "max_delay": 30,
        "on_timeout": True,
        "when": RETRY_WHEN,
    }
    round_trips(body)
    every = (
        "last.attempt < 3 and last.signal == None and last.duration_s < 9.5 "
        "and len(last.stderr_tail) >= 0 and last.reason != 'lost'"
    )
    assert task(one_task(f'retry = {{ limit = 1, on_exit = [2], when = "{every}" }}'))


@pytest.mark.parametrize(
    ("when", "code", "says"),
    [
        ("1", "wrong-type", "retry when must be a string"),
        ('" "', "bad-value", "must not be empty"),
        ('"last.exit_code =="', "when-syntax", "retry when"),
        ('"x = 1"', "when-syntax", "retry when"),
        ('"last.status == 1"', "when-unknown-name", "last.status: the last attempt has"),
        ('"params.n > 1"', "when-unknown-name", "unknown name 'params'"),
        ("\"needs.a.status == 'failed'\"", "when-unknown-name", "unknown name 'needs'"),
    ],
)
def test_retry_when_refusals_are_located(when: str, code: str, says: str) -> None:
    message = assert_refused(one_task(f"retry = {{ limit = 1, when = {when} }}"), code, 15)
    assert says in message


def test_an_unknown_retry_member_beside_when_is_refused_where_it_is() -> None:
    message = assert_refused(
        one_task('retry = { limit = 1, when = "True", unless = "False" }'), "unknown-key", 15
    )
    assert "'unless'" in message and "when" in message


def test_retry_when_is_refused_below_edition_4() -> None:
    head = 'edition = 3\n[workflow]\nname = "v"\n'
    found = codes(one_task('retry = { limit = 1, when = "True" }'), head)
    assert found and found[0][0] == "unknown-key" and "edition 4" in found[0][2], found


# -- the same vocabulary from Starlark ------------------------------------------------------

STAR = """
workflow(
    name = "v",
    params = {"n": {"type": "integer", "default": 2}},
    tasks = [
        task(name = "m", run = "true", matrix = {"include": [{"os": "a"}, {"os": "b"}]}),
        task(name = "s", run = "true", map = {"count": "params.n", "format": "%02d"},
             on_empty = "skip"),
        task(name = "r", run = "true", retry = {"limit": 2, "when": "last.attempt < 2"}),
    ],
)
"""


def test_the_new_vocabulary_is_the_same_from_starlark(tmp_path: Path) -> None:
    (tmp_path / "pack.star").write_text(STAR)
    (tmp_path / "pack.toml").write_text('edition = 4\n[workflow]\nsource = "pack.star"\n')
    tasks = {t["name"]: t for t in compile_path(tmp_path / "pack.toml").plan["tasks"]}
    toml = plan_of(
        one_task('matrix = { include = [{ os = "a" }, { os = "b" }] }')
        + '[[workflow.task]]\nname = "s"\nrun = "true"\n'
        + 'map = { count = "params.n", format = "%02d" }\non_empty = "skip"\n'
        + '[[workflow.task]]\nname = "r"\nrun = "true"\n'
        + 'retry = { limit = 2, when = "last.attempt < 2" }\n'
    )
    expected = {t["name"]: t for t in toml["tasks"]}
    assert tasks["m"]["matrix"] == expected["t"]["matrix"]
    assert tasks["s"] == expected["s"]
    assert tasks["r"] == expected["r"]


# -- the typed plan model (crucible.core.plan) reads the new forms -----------------------


def test_the_plan_model_reads_sequences_with_params_and_format_and_retry_when() -> None:
    from crucible.core.plan import ParamSource, SequenceSource, Task

    body = (
        one_task('map = { start = "params.n", end = 1, step = -1, format = "T-%02d" }')
        + '[[workflow.task]]\nname = "c"\nrun = "true"\nmap = { count = 3, format = "%x" }\n'
        + '[[workflow.task]]\nname = "r"\nrun = "true"\n'
        + 'retry = { limit = 1, when = "last.attempt < 2" }\n'
    )
    tasks = {t["name"]: t for t in plan_of(body)["tasks"]}
    t = Task.from_json(tasks["t"], "", 3)
    assert t.map == SequenceSource(start=ParamSource("n"), step=-1, end=1, format="T-%02d")
    assert t.to_json() == tasks["t"]
    c = Task.from_json(tasks["c"], "", 3)
    assert c.map == SequenceSource(0, 1, count=3, format="%x")
    r = Task.from_json(tasks["r"], "", 3)
    assert r.retry is not None and r.retry.when == "last.attempt < 2"
    assert r.to_json() == tasks["r"]


# -- format: what the compiler accepts, the dispatcher can always format -------------------

_TEXT = st.text(st.characters(blacklist_characters="%\x00"), max_size=8)
_CONVERSION = st.builds(
    lambda flags, width, prec, kind: f"%{flags}{width}{prec}{kind}",
    st.text(st.sampled_from("-+ 0#"), max_size=3),
    st.sampled_from(["", "1", "02", "10", "64"]),
    st.sampled_from(["", ".0", ".3", ".64"]),
    st.sampled_from("diouxX"),
)
_SAFE = st.integers(-(2**53) + 1, 2**53 - 1)


@settings(max_examples=200, deadline=None)
@given(before=_TEXT, conversion=_CONVERSION, after=_TEXT, number=_SAFE)
def test_every_well_formed_format_is_accepted_and_formats_any_number(
    before: str, conversion: str, after: str, number: int
) -> None:
    fmt = before + conversion + after
    assert format_problem(fmt) is None, fmt
    text = fmt % number
    assert text.startswith(before) and text.endswith(after)


@settings(max_examples=300, deadline=None)
@given(fmt=st.text(st.sampled_from("%d-s.0123456789fxc( #*"), max_size=12), number=_SAFE)
def test_a_format_the_compiler_accepts_never_fails_at_run_time(fmt: str, number: int) -> None:
    if format_problem(fmt) is None:
        assert isinstance(fmt % number, str)


def test_a_format_with_no_conversion_is_refused() -> None:
    assert format_problem("plain") is not None
    assert format_problem("100%%") is not None


def test_the_graph_shows_an_include_only_matrix_and_on_empty() -> None:
    from crucible.compile._graph import render

    body = one_task('matrix = { include = [{ os = "a" }] }\non_empty = "skip"')
    body += '[[workflow.task]]\nname = "s"\nrun = "true"\nmap = { count = "params.n", format = "%02d" }\n'
    out = render(plan_of(body), "dot")
    assert "matrix of its include entries\\n1 include\\n(skipped when empty)" in out
    assert "map '%02d' of from 0, count params.n" in out
