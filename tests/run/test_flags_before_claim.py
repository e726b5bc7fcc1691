"""Every flag is checked before the state dir is claimed (issue 27 item 12): an
``--outputs``/``--events``/``--publish-dir`` the run could only fail on at its
end, an out-of-range emit cap, ``--scheduler`` without ``--executor dask``, and
a refusal of the executor at start-up (a resource no worker offers) leave the
state dir unclaimed, so the same command works once the cause is fixed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from tests.run.dispatchtests import DISPATCH

PACK = """\
edition = 4
[workflow]
name = "flags"
[[workflow.task]]
name = "t"
run = '''echo '{"n": 1}' > "$CRUCIBLE_OUTPUT"; echo hi > a.txt'''
emits = { n = "integer" }
emits_files = ["a.txt"]
[workflow.outputs]
n = "t.n"
[workflow.publish]
"out" = { from = ["t:*.txt"] }
"""


def _run(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK)
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / "state"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _refused(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def _unclaimed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert not (state / "plan.json").exists() and not (state / "params.json").exists()
    assert not state.exists(), sorted(os.listdir(state))


def test_outputs_a_directory_is_refused_up_front(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    _refused(_run(tmp_path, "--outputs", str(tmp_path / "d")), 2, "--outputs", "directory")
    _unclaimed(tmp_path)


def test_outputs_a_dangling_link_is_refused_up_front(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    _refused(_run(tmp_path, "--outputs", str(tmp_path / "link")), 2, "dangling")
    _unclaimed(tmp_path)


def test_outputs_a_fifo_without_reader_is_refused_up_front(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    _refused(_run(tmp_path, "--outputs", str(tmp_path / "fifo")), 2, "FIFO with no reader")
    _unclaimed(tmp_path)


def test_outputs_a_fifo_with_a_reader_gets_the_results(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # the reader is there from the start, and reads until the run closes it
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        done = _run(tmp_path, "--outputs", str(fifo))
        got, _ = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert done.returncode == 0, done.stderr
    assert b'"n":1' in got


@pytest.mark.parametrize("name", ["plan.json", "params.json", "new.json"])
def test_outputs_into_the_state_dir_is_refused_and_the_plan_kept(tmp_path: Path, name: str) -> None:
    first = _run(tmp_path)
    assert first.returncode == 0, first.stderr
    plan = (tmp_path / "state" / "plan.json").read_bytes()
    done = _run(tmp_path, "--resume", "--outputs", str(tmp_path / "state" / name))
    _refused(done, 2, "--outputs", "state dir")
    assert (tmp_path / "state" / "plan.json").read_bytes() == plan
    again = _run(tmp_path, "--resume")
    assert again.returncode == 0, again.stderr


def test_events_into_the_state_dir_is_refused(tmp_path: Path) -> None:
    done = _run(tmp_path, "--events", str(tmp_path / "state" / "session.jsonl"))
    _refused(done, 2, "--events", "state dir")
    _unclaimed(tmp_path)


def test_publish_dir_a_fifo_is_refused_up_front(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pd")
    _refused(_run(tmp_path, "--publish-dir", str(tmp_path / "pd")), 2, "--publish-dir")
    _unclaimed(tmp_path)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_emit_cap_past_the_json_range_is_refused_naming_its_source(
    tmp_path: Path, how: str
) -> None:
    big = "9007199254740993"
    if how == "flag":
        done = _run(tmp_path, "--emit-cap", big)
        source = "--emit-cap"
    else:
        done = _run(tmp_path, env={"CRUCIBLE_EMIT_CAP": big})
        source = "CRUCIBLE_EMIT_CAP"
    _refused(done, 2, source, big)
    _unclaimed(tmp_path)


def test_scheduler_without_executor_dask_is_a_usage_error(tmp_path: Path) -> None:
    done = _run(tmp_path, "--scheduler", "tcp://127.0.0.1:8786")
    _refused(done, 2, "--scheduler", "--executor dask")
    _unclaimed(tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs distributed")
def test_a_resource_refusal_leaves_the_state_unclaimed(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(
        'edition = 4\n[workflow]\nname = "r"\n'
        '[[workflow.task]]\nname = "t"\nrun = "true"\nresources = { gpu = 1 }\n'
    )
    argv = [DISPATCH, str(pack), "--state", str(tmp_path / "state"), "--executor", "dask-local"]
    for _ in range(2):  # the same command says the same, not "already holds a run"
        done = subprocess.run([*argv, "-j", "1"], capture_output=True, text=True, timeout=120)
        _refused(done, 1, "no Dask worker offers gpu")
        _unclaimed(tmp_path)
