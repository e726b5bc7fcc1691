"""Issue 27 item 21: each message that named the wrong thing, printed a wrong
number or said nothing, now says what is wrong and where."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from crucible.core import canon
from tests.run.dispatchtests import DISPATCH

PACK = """edition = 4
[workflow]
name = "x"
[workflow.params.items]
type = "any"
default = 1
[workflow.params.x]
type = "number"
default = 1
[workflow.params.i]
type = "integer"
default = 1
[[workflow.task]]
name = "a"
run = "true"
"""


def _dispatch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK)
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / "s"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        # was: must be a JSON any, not array
        (
            "items=[1e400]",
            "params.items: param 'items': '[1e400]' is JSON crucible does not accept "
            "(number is infinity when parsed as double",
        ),
        # was: named 9007199254740992
        (
            "x=9007199254740993",
            "params.x: param 'x': 9007199254740993 is outside the integers JSON carries exactly",
        ),
        # was: a 309-digit integer
        ("i=1.5e308", "params.i: param 'i': 1.5e+308 is outside the integers JSON carries"),
        # was: $: nesting deeper than 128 levels (no param named)
        (
            "items=" + "[" * 200 + "]" * 200,
            "(400 characters) is JSON crucible does not accept (nesting deeper than 128 levels)",
        ),
    ],
)
def test_param_values_crucible_refuses_are_named_and_printed_as_given(
    tmp_path: Path, pair: str, message: str
) -> None:
    done = _dispatch(tmp_path, "-p", pair)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("crucible-dispatch: error: params.")
    assert message in line, line
    assert not (tmp_path / "s").exists()  # refused before the state is claimed


def test_a_huge_float_is_a_number_param(tmp_path: Path) -> None:
    done = _dispatch(tmp_path, "-p", "x=1.5e308")
    assert done.returncode == 0, done.stderr
    assert b'"x":1.5e+308' in (tmp_path / "s" / "params.json").read_bytes()


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        (b'{"n": 9007199254740993}', True),
        (b"[1e400]", True),
        (b'{"a": 1, "a": 2}', True),
        (b"[" * 200 + b"]" * 200, True),
        (b"[NaN]", False),
        (b"{x", False),
    ],
)
def test_canon_says_whether_a_refused_text_is_json(text: bytes, valid: bool) -> None:
    with pytest.raises(canon.CanonError) as info:
        canon.loads(text)
    assert info.value.valid_json is valid


def test_a_result_with_a_huge_integer_is_valid_json_crucible_refuses(tmp_path: Path) -> None:
    # was: result file … is not valid JSON: integer … is outside ±(2^53−1)
    pack = tmp_path / "pack.toml"
    pack.write_text(
        'edition = 3\n[workflow]\nname = "r"\n[[workflow.task]]\nname = "a"\n'
        'emits = { n = "integer" }\n'
        """run = "echo '{\\"n\\": 9007199254740993}' > $CRUCIBLE_OUTPUT"\n"""
    )
    state = tmp_path / "s"
    done = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    from crucible import stage

    record = stage.load_result(state, "a")
    assert record is not None
    assert (
        "holds JSON crucible does not accept: integer 9007199254740993 is outside" in record["note"]
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("..", "task name '..' is a relative directory"),
        ("", "task name is empty"),
        ("/abs", "task name '/abs' contains a path separator"),
    ],
)
def test_cache_forget_refuses_a_name_no_task_can_have(tmp_path: Path, name: str, why: str) -> None:
    # was: {"forgotten":0} and exit 0
    cache = tmp_path / "cache"
    cache.mkdir()
    done = subprocess.run(
        [DISPATCH, "cache", "forget", name, "--cache", str(cache)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"crucible-dispatch: error: {why}: no task can have this name\n"


def test_a_resource_no_worker_offers_that_much_of_says_the_most_offered() -> None:
    # was: "no Dask worker offers memory" for a 1000 TiB need, while every worker did
    from crucible.core.errors import InputRefused
    from crucible.core.plan import Resources, Task
    from crucible.run.executors.dask._executor import _check_resources

    info = {"workers": {"a": {"resources": {"cpus": 4, "memory": 16 * 2**30}}}}
    big = Task(name="big", kind="command", resources=Resources(memory=1000 * 2**40, gpu=1))
    with pytest.raises(InputRefused) as refused:
        _check_resources({"big": big}, info)
    assert refused.value.message == (
        "task 'big' needs resources gpu=1, memory=1000 TiB; no Dask worker offers gpu; "
        "no Dask worker offers memory=1000 TiB (the most one offers: 16 GiB)"
    )
