"""A unit with nothing to stage gets no inputs/ tree (issue 14; docs/spec/
inputs.md 3.7): three inodes per no-op task (workspace, result file, record)
instead of seven, and every unit that has something to stage is unchanged."""

from __future__ import annotations

import os
from pathlib import Path

from crucible.stage import StateDir
from tests.run.dispatchtests import dispatch, result
from tests.stage.stageplans import plan, task

PLAIN = """edition = {edition}

[workflow]
name = "plain"
{params}
[[workflow.task]]
name = "a"
emits = {{ listing = "string", env = "string" }}
run = '''printf '{{"listing": "%s", "env": "%s"}}' "$(ls -A "$CRUCIBLE_INPUTS_DIR" | tr '\\n' ' ')" "$CRUCIBLE_INPUTS_DIR" > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "b"
run = 'printf "{{}}" > "$CRUCIBLE_OUTPUT"'
"""


def _dispatch(tmp_path: Path, text: str, *extra: str) -> Path:
    pack = tmp_path / "pack.toml"
    pack.write_text(text)
    state = tmp_path / "st"
    r = dispatch(pack, "--state", state, "-j", "2", *extra)
    assert r.returncode == 0, r.stderr
    return state


def _inodes(path: Path) -> int:
    return 1 + sum(len(dirs) + len(files) for _, dirs, files in os.walk(path))


def test_a_task_with_nothing_to_stage_gets_the_shared_empty_directory(tmp_path: Path) -> None:
    state = _dispatch(tmp_path, PLAIN.format(edition=3, params=""))
    empty = state / "shared" / "@empty"
    a = result(state, "a")
    assert a is not None and a["status"] == "passed"
    assert a["output"] == {"listing": "", "env": str(empty.absolute())}
    assert empty.is_dir() and empty.stat().st_mode & 0o777 == 0o555
    assert list(empty.iterdir()) == []
    for name in ("a", "b"):
        ws = state / "work" / name
        assert not (ws / "inputs").exists()
        assert _inodes(ws) == 1  # the workspace alone: its tree cost 5 inodes before


def test_params_declared_inputs_files_and_items_are_still_staged(tmp_path: Path) -> None:
    """Each of these gives the unit something to stage: it gets its tree."""
    state = _dispatch(
        tmp_path,
        PLAIN.format(edition=3, params='[workflow.params]\nwho = { type = "string", default = "me" }\n'),
    )
    a = result(state, "a")
    assert a is not None and a["output"]["listing"].split() == ["index.json", "params"]
    assert (state / "work" / "b" / "inputs" / "@values" / "params").read_bytes() == b'{"who":"me"}'


def test_edition_2_still_stages_its_one_object(tmp_path: Path) -> None:
    state = _dispatch(
        tmp_path,
        'edition = 2\n[workflow]\nname = "v1"\n[[workflow.task]]\nname = "a"\n'
        "run = 'cat \"$CRUCIBLE_INPUTS_FILE\" > seen; printf \"{}\" > \"$CRUCIBLE_OUTPUT\"'\n",
    )
    assert (state / "work" / "a" / "seen").read_bytes() == b'{"params":{}}'


def test_which_units_have_nothing_to_stage(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "params.json").write_bytes(b"{}")
    p = plan(
        task("lone"),
        task("files", emits_files=["out/**"]),
        task("under_files", needs=["files"]),
        task("reads", needs=["lone"], inputs={"x": "lone.x"}),
        task("agent", kind="agent", prompt="hi"),
        task("last", epilogue=True),
        version=2,
    )
    nothing: dict[str, bool] = {}
    for name in ("lone", "files", "under_files", "agent", "last"):
        ws = state / "work" / name
        staged = StateDir(p, state).stage_inputs(name, ws)
        nothing[name] = staged.index is None
        assert (ws / "inputs").exists() is not nothing[name]
    assert nothing == {
        "lone": True,
        "files": True,  # its own emits_files are its output, not its input
        "under_files": False,
        "agent": False,
        "last": False,
    }


def test_an_old_tree_is_removed_when_there_is_nothing_to_stage(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "params.json").write_bytes(b"{}")
    p = plan(task("lone"), version=2)
    ws = state / "work" / "lone"
    (ws / "inputs" / "@values").mkdir(parents=True)
    (ws / "inputs" / "@values" / "params").write_bytes(b'{"old":1}')
    staged = StateDir(p, state).stage_inputs("lone", ws)
    assert not (ws / "inputs").exists()
    assert staged.env == {"CRUCIBLE_INPUTS_DIR": str((state / "shared" / "@empty").absolute())}


def test_a_task_with_nothing_to_stage_is_cached(tmp_path: Path) -> None:
    text = PLAIN.format(edition=4, params="")
    cache = tmp_path / "cache"
    _dispatch(tmp_path, text, "--cache", str(cache))
    second = tmp_path / "again"
    second.mkdir()
    state = _dispatch(second, text, "--cache", str(cache))
    a = result(state, "a")
    assert a is not None and a["status"] == "passed" and a.get("cached") is True
