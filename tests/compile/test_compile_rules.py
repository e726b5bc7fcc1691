"""Every validation rule, with its stable code and file:line:col."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from crucible.compile import ValidationFailed, compile_path
from crucible.compile._diagnostics import Diagnostic

WritePack = Callable[..., Path]


def diagnostics(write_pack: WritePack, text: str) -> list[Diagnostic]:
    path = write_pack(text)
    with pytest.raises(ValidationFailed) as info:
        compile_path(path)
    return info.value.diagnostics


def one(write_pack: WritePack, text: str) -> Diagnostic:
    found = diagnostics(write_pack, text)
    assert len(found) == 1, [d.text() for d in found]
    return found[0]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def task(name: str, extra: str = "") -> str:
    return f'[[workflow.task]]\nname = "{name}"\nrun = "true"\n{extra}\n'


HEAD = '[workflow]\nname = "w"\n\n'
HEAD3 = "edition = 3\n" + HEAD


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("", "name-empty"),
        (".", "name-dot"),
        ("..", "name-dot"),
        ("a/b", "name-separator"),
        ("a\\\\b", "name-separator"),
        ("/abs", "name-separator"),
        ("@values", "name-reserved-prefix"),
        ("a[0]", "name-bracketed"),
        ("]", "name-bracketed"),
        ("a\\u0000b", "name-control"),
        ("x" * 256, "name-too-long"),
    ],
)
def test_bad_task_names(write_pack: WritePack, name: str, code: str) -> None:
    d = one(write_pack, HEAD + task(name))
    assert d.code == code
    assert (d.location.line, d.location.col) == (5, 1)  # the name = … line


@pytest.mark.parametrize("reserved", ["params", "item", "history", "revision", "kept", "outcome"])
@pytest.mark.parametrize("edition", [1, 2, 3])
def test_reserved_input_names_refused_as_task_names_in_every_edition(
    write_pack: WritePack, reserved: str, edition: int
) -> None:
    d = one(write_pack, f"edition = {edition}\n" + HEAD + task(reserved))
    assert d.code == "name-reserved-input"


def test_valid_unusual_names_pass(write_pack: WritePack) -> None:
    compile_path(write_pack(HEAD + task("a.b") + task("ünï cödé") + task("-x") + task("...")))


def test_duplicate_names(write_pack: WritePack) -> None:
    d = one(write_pack, HEAD + task("a") + task("a"))
    assert d.code == "duplicate-task" and d.location.line == 9


def test_unknown_need_points_at_the_element(write_pack: WritePack) -> None:
    d = one(write_pack, HEAD + task("a", 'needs = ["zz"]'))
    assert d.code == "unknown-need"
    assert (d.location.line, d.location.col) == (7, 10)


def test_cycle_is_printed(write_pack: WritePack) -> None:
    d = one(
        write_pack,
        HEAD
        + task("a", 'needs = ["c"]')
        + task("b", 'needs = ["a"]')
        + task("c", 'needs = ["b"]')
        + task("d", 'needs = ["a"]'),
    )
    assert d.code == "cycle"
    assert d.message == "dependency cycle: a -> c -> b -> a"


def test_self_cycle(write_pack: WritePack) -> None:
    d = one(write_pack, HEAD + task("a", 'needs = ["a"]'))
    assert d.message == "dependency cycle: a -> a"


def test_needs_epilogue(write_pack: WritePack) -> None:
    d = one(write_pack, HEAD + task("fin", "epilogue = true") + task("a", 'needs = ["fin"]'))
    assert d.code == "needs-epilogue"


def test_epilogue_may_need_others(write_pack: WritePack) -> None:
    plan = compile_path(
        write_pack(HEAD + task("a") + task("fin", 'epilogue = true\nneeds = ["a"]'))
    ).plan
    assert plan["tasks"][1]["epilogue"] is True


PRODUCER = task("p", 'emits = { xs = "array", o = "object", s = "string", any = "any" }')


@pytest.mark.parametrize("field", ["xs", "o", "any"])
def test_map_over_collections(write_pack: WritePack, field: str) -> None:
    plan = compile_path(
        write_pack(HEAD + PRODUCER + task("m", f'needs = ["p"]\nmap = "p.{field}"'))
    ).plan
    assert plan["tasks"][1]["map"] == f"p.{field}"


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ('needs = ["p"]\nmap = "p.s"', "map-not-collection"),
        ('needs = ["p"]\nmap = "p.nope"', "map-unknown-field"),
        ('map = "p.xs"', "map-not-dependency"),
        ('map = "ghost.xs"', "map-not-dependency"),
        ('needs = ["p"]\nmap = "p"', "bad-ref"),
        ('needs = ["p"]\nmap = "p.xs"\nepilogue = true', "epilogue-map"),
    ],
)
def test_map_rules(write_pack: WritePack, extra: str, code: str) -> None:
    text = HEAD + PRODUCER + task("m", extra)
    d = one(write_pack, text)
    assert d.code == code
    assert d.location.line == line_of(text, "map")


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ('inputs = { v = "p.s" }', "input-not-dependency"),
        ('needs = ["p"]\ninputs = { v = "p.zz" }', "input-unknown-field"),
        ('needs = ["p"]\ninputs = { item = "p.s" }', "input-reserved-name"),
        ('needs = ["p"]\ninputs = { v = "params.who" }', "input-reserved-source"),
        ('needs = ["p"]\ninputs = { "a b" = "p.s" }', "bad-name"),
        ('needs = ["p"]\ninputs = { v = "p" }', "bad-ref"),
        ('needs = ["p"]\ninputs = ["p.s"]', "wrong-type"),
    ],
)
def test_input_rules(write_pack: WritePack, extra: str, code: str) -> None:
    text = HEAD3 + PRODUCER + task("c", extra)
    d = one(write_pack, text)
    assert d.code == code
    assert d.location.line == line_of(text, "inputs")


def test_input_carries_the_producer_type(write_pack: WritePack) -> None:
    plan = compile_path(
        write_pack(HEAD3 + PRODUCER + task("c", 'needs = ["p"]\ninputs = { v = "p.s", w = "p.o" }'))
    ).plan
    assert plan["tasks"][1]["inputs"] == {
        "v": {"from": "p.s", "producer": "p", "field": "s", "type": "string"},
        "w": {"from": "p.o", "producer": "p", "field": "o", "type": "object"},
    }


def test_agents_never_receive_params(write_pack: WritePack) -> None:
    d = one(
        write_pack,
        HEAD3
        + '[workflow.params.k]\ntype = "string"\n\n'
        + PRODUCER
        + '[[workflow.task]]\nname = "ag"\nkind = "agent"\nprompt = "do it"\nneeds = ["p"]\ninputs = { k = "params.k" }\n',
    )
    assert d.code == "agent-params"
    assert "agents never receive params" in d.message


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ('kind = "agent"\nprompt = "x"', "agent-run"),
        ('prompt = "x"', "prompt-not-agent"),
        ('kind = "robot"', "bad-value"),
        ('join = "any"', "bad-value"),
        ("retries = -1", "bad-value"),
        ('retries = "2"', "wrong-type"),
        ("timeout = 0", "bad-value"),
        ("timeout = true", "wrong-type"),
        ("epilogue = 1", "wrong-type"),
        ('emits = { x = "str" }', "bad-type-name"),
        ('emits = { "x.y" = "string" }', "bad-name"),
        ('emits_files = ["../x"]', "bad-path"),
        ('emits_files = ["/etc/passwd"]', "bad-path"),
        ('needs = ["a", "a"]', "duplicate-entry"),
        ("description = 3", "wrong-type"),
        ('env = ["HOME"]', "unknown-key"),
        ('inputs = { a = "b.c" }', "unknown-key"),
        ("colour = 1", "unknown-key"),
        ("when = 1979-05-27", "unknown-key"),
    ],
)
def test_task_field_rules(write_pack: WritePack, extra: str, code: str) -> None:
    text = HEAD + task("t", extra)
    d = one(write_pack, text)
    assert d.code == code
    assert d.location.line == (6 if code == "agent-run" else 7)


def test_run_is_required_and_agent_needs_prompt(write_pack: WritePack) -> None:
    d = one(write_pack, HEAD + '[[workflow.task]]\nname = "t"\n')
    assert d.code == "missing-key" and d.location.line == 4
    d = one(write_pack, HEAD + '[[workflow.task]]\nname = "t"\nkind = "agent"\n')
    assert d.code == "missing-key" and "prompt" in d.message


def test_edition_gated_keys_name_the_edition(write_pack: WritePack) -> None:
    d = one(write_pack, "edition = 2\n" + HEAD + task("t", 'inputs = { a = "b.c" }'))
    assert d.code == "unknown-key" and "needs edition 3" in d.message
    d = one(write_pack, HEAD + task("t", 'env = ["HOME"]'))
    assert "needs edition 2" in d.message
    plan = compile_path(
        write_pack("edition = 2\n" + HEAD + task("t", 'env = ["HOME", "LANG"]'))
    ).plan
    assert plan["tasks"][0]["env"] == ["HOME", "LANG"]


@pytest.mark.parametrize(
    ("text", "code", "line"),
    [
        ('colour = 1\n[workflow]\nname = "w"\n' + task("a"), "unknown-key", 1),
        ('[workflow]\nname = "w"\nsize = 1\n' + task("a"), "unknown-key", 3),
        ('[workflow]\nname = ""\n' + task("a"), "bad-value", 2),
        ("[workflow]\n" + task("a"), "missing-key", 1),
        ('[workflow]\nname = "w"\n', "no-tasks", 1),
        ("edition = 1\n", "missing-key", None),
        (
            '[workflow]\nname = "w"\n[workflow.params.x]\ntype = "integer"\ndefault = "1"\n'
            + task("a"),
            "bad-default",
            5,
        ),
        (
            '[workflow]\nname = "w"\n[workflow.params.x]\ntype = "int"\n' + task("a"),
            "bad-type-name",
            4,
        ),
        (
            '[workflow]\nname = "w"\n[workflow.params.x]\ndefault = 1\n' + task("a"),
            "missing-key",
            3,
        ),
        (
            '[workflow]\nname = "w"\n[workflow.params.x]\ntype = "string"\nhelp = "?"\n'
            + task("a"),
            "unknown-key",
            5,
        ),
        (
            '[workflow]\nname = "w"\n[workflow.params."a b"]\ntype = "string"\n' + task("a"),
            "bad-name",
            3,
        ),
    ],
)
def test_workflow_rules(write_pack: WritePack, text: str, code: str, line: int | None) -> None:
    d = one(write_pack, text)
    assert d.code == code
    assert d.location.line == line


def test_every_problem_is_reported(write_pack: WritePack) -> None:
    found = diagnostics(
        write_pack,
        'colour = 1\n[workflow]\nname = "w"\n'
        + task("a", "x = 1\ny = 2")
        + task("b", 'join = "no"'),
    )
    assert [d.code for d in found] == ["unknown-key"] * 3 + ["bad-value"]
    assert [d.location.line for d in found] == [1, 7, 8, 12]


def test_params_with_defaults_compile(write_pack: WritePack) -> None:
    plan = compile_path(
        write_pack(
            '[workflow]\nname = "w"\n'
            '[workflow.params.n]\ntype = "integer"\ndefault = 3\ndescription = "how many"\n'
            '[workflow.params.f]\ntype = "number"\ndefault = 1\n'
            '[workflow.params.tags]\ntype = "array"\ndefault = ["a", 1]\n'
            '[workflow.params.req]\ntype = "object"\n' + task("a")
        )
    ).plan
    assert plan["workflow"]["params"] == {
        "n": {"type": "integer", "default": 3, "description": "how many"},
        "f": {"type": "number", "default": 1},
        "tags": {"type": "array", "default": ["a", 1]},
        "req": {"type": "object"},
    }


@pytest.mark.parametrize("run", ['["echo", "a\\u0000b"]', '"echo \\u0000"'])
def test_run_with_nul_is_bad_value(write_pack: WritePack, run: str) -> None:
    # compiled fine, then every attempt would fail at exec (embedded null byte)
    text = HEAD3 + f'[[workflow.task]]\nname = "a"\nrun = {run}\n'
    d = one(write_pack, text)
    assert (d.code, d.message) == ("bad-value", "run must not contain a NUL character")
    assert d.location.line == line_of(text, "run =")
