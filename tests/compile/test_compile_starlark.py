"""Starlark sources: edition-dependent kwarg allowlists, spans, resolved_from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from crucible.compile import ValidationFailed, compile_path
from crucible.compile._manifest import analyze_star
from crucible.core.errors import ParseError, UsageError

WritePack = Callable[..., Path]

STAR = """
def step(name, **kw):
    return task(name = name, run = ["echo", name], **kw)

a = step("a", emits = {"xs": "array", "n": "integer"})
b = step("b", needs = [a], map = "a.xs", join = "settled")
workflow(
    name = "starry",
    description = "built in Starlark",
    params = {"who": {"type": "string", "default": "world"}},
    tasks = [a, b, task(name = "fin", kind = "agent", prompt = "sum up", epilogue = True)],
)
"""


def manifest(edition: int, source: str = "pack.star") -> str:
    return f'edition = {edition}\n\n[workflow]\nsource = "{source}"\n'


@pytest.mark.parametrize("edition", [1, 2, 3])
def test_starlark_workflow_replaces_the_table(write_pack: WritePack, edition: int) -> None:
    plan = compile_path(write_pack(manifest(edition), pack__star=STAR)).plan
    assert plan["edition"] == edition
    assert plan["version"] == (2 if edition == 3 else 1)
    wf = plan["workflow"]
    assert wf["name"] == "starry" and wf["resolved_from"] == "pack.star"
    assert wf["params"] == {"who": {"type": "string", "default": "world"}}
    assert [t["name"] for t in plan["tasks"]] == ["a", "b", "fin"]
    assert plan["tasks"][1]["needs"] == ["a"] and plan["tasks"][1]["map"] == "a.xs"
    assert plan["tasks"][2]["epilogue"] is True and "run" not in plan["tasks"][2]


def test_starlark_and_toml_compile_to_the_same_tasks(write_pack: WritePack) -> None:
    star = compile_path(write_pack(manifest(3), pack__star=STAR)).plan
    toml = compile_path(
        write_pack(
            """
            edition = 3
            [workflow]
            name = "starry"
            description = "built in Starlark"
            [workflow.params.who]
            type = "string"
            default = "world"
            [[workflow.task]]
            name = "a"
            run = ["echo", "a"]
            emits = { xs = "array", n = "integer" }
            [[workflow.task]]
            name = "b"
            run = ["echo", "b"]
            needs = ["a"]
            map = "a.xs"
            join = "settled"
            [[workflow.task]]
            name = "fin"
            kind = "agent"
            prompt = "sum up"
            epilogue = true
            """,
            name="other.toml",
        )
    ).plan
    del star["workflow"]["resolved_from"]
    assert star == toml


@pytest.mark.parametrize("edition", [1, 2])
def test_inputs_kwarg_is_unknown_below_edition_3_with_span(
    write_pack: WritePack, edition: int
) -> None:
    src = (
        'a = task(name = "a", run = "x", emits = {"v": "string"})\n'
        'b = task(name = "b", run = "y", needs = ["a"],\n    inputs = {"v": "a.v"})\nworkflow(name = "w", tasks = [a, b])\n'
    )
    path = write_pack(manifest(edition), pack__star=src)
    with pytest.raises(ValidationFailed) as info:
        compile_path(path)
    (d,) = info.value.diagnostics
    assert d.code == "unknown-key"
    assert "'inputs'" in d.message and "needs edition 3" in d.message
    assert d.location.file == str(path.parent / "pack.star")
    assert (d.location.line, d.location.col) == (2, 5)


def test_inputs_kwarg_accepted_at_edition_3(write_pack: WritePack) -> None:
    src = 'a = task(name = "a", run = "x", emits = {"v": "string"})\nb = task(name = "b", run = "y", needs = ["a"], inputs = {"v": "a.v"})\nworkflow(name = "w", tasks = [a, b])\n'
    plan = compile_path(write_pack(manifest(3), pack__star=src)).plan
    assert plan["tasks"][1]["inputs"]["v"]["type"] == "string"


def test_workflow_takes_no_edition(write_pack: WritePack) -> None:
    src = 'workflow(name = "w", edition = 3, tasks = [task(name = "a", run = "x")])\n'
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(manifest(3), pack__star=src))
    (d,) = info.value.diagnostics
    assert "does not take edition" in d.message and d.location.line == 1


@pytest.mark.parametrize(
    ("src", "code", "line"),
    [
        (
            'workflow(name = "w", tasks = [task(name = "a", run = "x", colour = 1)])\n',
            "unknown-key",
            1,
        ),
        ('x = 1\nworkflow(name = "w", tasks = [task(name = "a", run = 3)])\n', "wrong-type", 2),
        ('workflow(name = "w", tasks = ["a"])\n', "wrong-type", 1),
        ('workflow(name = "w", size = 1, tasks = [])\n', "unknown-key", 1),
        (
            't = task(name = "a", run = "x")\nworkflow(name = "w", tasks = [t])\nworkflow(name = "v", tasks = [t])\n',
            "duplicate-workflow",
            3,
        ),
        ('t = task("a")\n', "positional", 1),
        ("x = 1\n", "no-workflow", None),
        ('x = 1\ny = x + "s"\n', "starlark-error", 2),
        ("x = undefined_name\n", "starlark-error", 1),
        ('load("other.star", "x")\n', "starlark-error", 1),
        (
            'workflow(name = "w", tasks = [task(name = "a", run = "x", timeout = 1e400)])\n',
            "wrong-type",
            1,
        ),
        (
            'workflow(name = "w", tasks = [task(name = "a", run = "x", description = None)])\n',
            "wrong-type",
            1,
        ),
        (
            'workflow(name = "w", tasks = [task(name = "a", run = "x", emits = {1: "string"})])\n',
            "bad-name",
            1,
        ),
        (
            'def f():\n    pass\nworkflow(name = "w", tasks = [task(name = f, run = "x")])\n',
            "starlark-error",
            3,
        ),
        (
            'workflow(name = "w", params = {"p": {"type": "integer", "default": 9007199254740992}}, tasks = [task(name = "a", run = "x")])\n',
            "bad-default",
            1,
        ),
    ],
)
def test_starlark_errors_carry_spans(
    write_pack: WritePack, src: str, code: str, line: int | None
) -> None:
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(manifest(3), pack__star=src))
    (d,) = info.value.diagnostics
    assert d.code == code
    assert d.location.line == line
    assert "\n" not in d.message


def test_graph_rules_locate_starlark_tasks_by_name(write_pack: WritePack) -> None:
    src = 'a = task(name = "a", run = "x")\n\nb = task(name = "b", run = "x", needs = ["zz"])\nworkflow(name = "w", tasks = [a, b])\n'
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(manifest(3), pack__star=src))
    (d,) = info.value.diagnostics
    assert d.code == "unknown-need" and (d.location.line, d.location.col) == (3, 10)


def test_starlark_syntax_error_is_a_parse_error(write_pack: WritePack) -> None:
    path = write_pack(manifest(3), pack__star="a = (\n")
    with pytest.raises(ParseError) as info:
        compile_path(path)
    assert str(info.value).startswith(f"{path.parent / 'pack.star'}:")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("source", "code"), [("../x.star", "bad-path"), ("/etc/x.star", "bad-path"), ("", "wrong-type")]
)
def test_source_must_stay_inside_the_pack(write_pack: WritePack, source: str, code: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(manifest(3, source)))
    assert info.value.diagnostics[0].code == code


def test_source_excludes_other_workflow_keys(write_pack: WritePack) -> None:
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(manifest(3) + 'name = "w"\n', pack__star=STAR))
    assert info.value.diagnostics[0].code == "source-exclusive"


def test_missing_source_is_exit_2(write_pack: WritePack) -> None:
    with pytest.raises(UsageError) as info:
        compile_path(write_pack(manifest(3)))
    assert "does not exist" in str(info.value) and ":4:1:" in str(info.value)


def test_analyze_star_alone(tmp_path: Path) -> None:
    star = tmp_path / "pack.star"
    star.write_text(STAR)
    analysis = analyze_star(star, 3)
    assert analysis.compiled is not None and not analysis.errors
    assert analysis.compiled.plan["workflow"]["resolved_from"] == "pack.star"


def test_runaway_evaluation_is_stopped() -> None:
    from crucible.compile._star import evaluate_source

    src = "def f():\n    for i in range(2000000000):\n        for j in range(2000000000):\n            pass\nf()\n"
    result = evaluate_source(src, "loop.star", 3, timeout=0.2)
    (d,) = result.diagnostics
    assert d.code == "starlark-timeout" and d.location.file == "loop.star"


def test_source_symlink_outside_the_pack_is_refused(write_pack: WritePack, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside.star"
    outside.write_text('workflow(name = "w", tasks = [task(name = "a", run = "x")])\n')
    (tmp_path / "pack.star").symlink_to(outside)
    with pytest.raises(ValidationFailed) as info:
        compile_path(write_pack(manifest(3)))
    assert info.value.diagnostics[0].code == "bad-path"


def test_ctrl_c_stops_a_long_evaluation() -> None:
    # starlark-pyo3 swallows a KeyboardInterrupt raised inside its cancel callback,
    # so Ctrl-C used to be ignored until the loop ended (then the plan printed, exit 0).
    import os
    import signal
    import threading

    from crucible.compile._star import evaluate_source

    spin = "def spin():\n    for i in range(1000000000):\n        pass\nspin()\n"
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    done = threading.Event()

    def press_ctrl_c() -> None:
        while not done.wait(0.3):
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=press_ctrl_c, daemon=True)
    try:
        sender.start()
        with pytest.raises(KeyboardInterrupt):
            evaluate_source(spin, "spin.star", 3, timeout=8.0)
    finally:
        done.set()
        sender.join()
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    ("source", "code", "message"),
    [
        # NUL escaped as ValueError (exit 70)
        ("x\\u0000.star", "bad-path", "source 'x\\x00.star' must be a relative path to a file"),
        # said "source must be a relative path, not string"
        ("", "wrong-type", "source must be a non-empty relative path"),
    ],
)
def test_empty_or_nul_source(write_pack: WritePack, source: str, code: str, message: str) -> None:
    path = write_pack(f'edition = 3\n[workflow]\nsource = "{source}"\n')
    with pytest.raises(ValidationFailed) as info:
        compile_path(path)
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == (code, message)
    assert (d.location.line, d.location.col) == (3, 1)


def test_unreadable_source_names_the_manifest_line(write_pack: WritePack) -> None:
    path = write_pack('edition = 3\n[workflow]\nsource = "dir.star"\n')
    (path.parent / "dir.star").mkdir()
    # a directory is the wrong kind of path: usage (2), as a manifest dir (issue 12 item 23)
    with pytest.raises(UsageError, match="is a directory") as info:
        compile_path(path)
    assert info.value.where == f"{path}:3:1" and info.value.exit_code == 2
