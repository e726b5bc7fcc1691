"""``sandbox = true`` end to end (docs/spec/cache.md, "The sandbox"), through
real ``crucible-dispatch`` subprocesses, once with Landlock and once with the
bubblewrap fallback forced (``CRUCIBLE_SANDBOX``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crucible.core.plan import Task
from crucible.run.executors._sandbox import SandboxUnavailable, choose, landlock_abi
from tests.run.dispatchtests import DISPATCH

MECHANISMS = [
    pytest.param(
        "landlock",
        marks=pytest.mark.skipif(landlock_abi() < 4, reason="no Landlock ABI 4 here"),
    ),
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
    ),
]

PY = "/usr/bin/python3"

# every task reads data/a.csv through the workflow's default; none declares secret.txt
PACK = """edition = 4

[workflow]
name = "sandboxed"
reads = ["data/*.csv"]
SANDBOX

[[workflow.task]]
name = "declared"
emits = { words = "integer" }
run = 'echo "{\\"words\\": $(cat "$CRUCIBLE_PACK_DIR"/data/*.csv | wc -w)}" > "$CRUCIBLE_OUTPUT"; echo tmp > "$TMPDIR/t"; ls "$CRUCIBLE_PACK_DIR/data"'

[[workflow.task]]
name = "undeclared"
run = 'cat "$CRUCIBLE_PACK_DIR/data/c.txt"'

[[workflow.task]]
name = "writer"
run = 'echo x > "$CRUCIBLE_PACK_DIR/data/written.txt"'

[[workflow.task]]
name = "connect"
env = ["PORT"]
run = ["PY", "-I", "-c", "import os, socket; socket.create_connection(('127.0.0.1', int(os.environ['PORT'])), timeout=10).close()"]
NETWORK
""".replace("PY", PY)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def _pack(tmp: Path, *, sandbox: bool = True, network: bool = False) -> Path:
    pack = tmp / "pack"
    (pack / "data").mkdir(parents=True, exist_ok=True)
    (pack / "data" / "a.csv").write_text("one two three\n")
    (pack / "data" / "c.txt").write_text("not declared\n")
    text = PACK.replace("SANDBOX", "sandbox = true" if sandbox else "")
    (pack / "pack.toml").write_text(text.replace("NETWORK", "network = true" if network else ""))
    return pack


def _dispatch(
    pack: Path, state: Path, mechanism: str, port: int, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    env.update(CRUCIBLE_SANDBOX=mechanism, PORT=str(port))
    return subprocess.run(
        [DISPATCH, str(pack / "pack.toml"), "--state", str(state), *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def _records(state: Path) -> dict[str, dict[str, object]]:
    return {p.stem: json.loads(p.read_text()) for p in (state / "results").glob("*.json")}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sandboxed_tasks_read_only_what_they_declare(
    tmp_path: Path, mechanism: str, listener: int
) -> None:
    pack = _pack(tmp_path)
    proc = _dispatch(pack, tmp_path / "st", mechanism, listener)
    assert proc.returncode == 1, proc.stderr
    records = _records(tmp_path / "st")
    assert all(r["sandbox"] is True for r in records.values())
    assert records["declared"]["status"] == "passed"
    assert records["declared"]["output"] == {"words": 3}
    # its private TMPDIR is its workspace
    assert (tmp_path / "st" / "work" / "declared" / "t").read_text() == "tmp\n"
    bad = records["undeclared"]
    assert bad["status"] == "failed"
    assert str(bad["note"]).startswith(
        f"sandbox: permission denied reading {pack / 'data' / 'c.txt'} (not in reads)"
    )
    writer = records["writer"]
    assert writer["status"] == "failed"
    assert str(writer["note"]).startswith(
        f"sandbox: permission denied writing {pack / 'data' / 'written.txt'}"
    )
    assert not (pack / "data" / "written.txt").exists()
    assert records["connect"]["status"] == "failed"
    assert str(records["connect"]["note"]).startswith("sandbox: ")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_network_true_lets_a_sandboxed_task_connect(
    tmp_path: Path, mechanism: str, listener: int
) -> None:
    pack = _pack(tmp_path, network=True)
    _dispatch(pack, tmp_path / "st", mechanism, listener, "--target", "connect")
    record = _records(tmp_path / "st")["connect"]
    assert record["status"] == "passed", record["note"]
    assert record["sandbox"] is True


def test_the_same_tasks_unsandboxed_read_and_write_freely(tmp_path: Path, listener: int) -> None:
    pack = _pack(tmp_path, sandbox=False)
    proc = _dispatch(pack, tmp_path / "st", "", listener)
    assert proc.returncode == 0, proc.stderr
    records = _records(tmp_path / "st")
    assert all(r["status"] == "passed" and "sandbox" not in r for r in records.values())
    assert (pack / "data" / "written.txt").exists()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_dash_dash_sandbox_sandboxes_every_task(
    tmp_path: Path, mechanism: str, listener: int
) -> None:
    pack = _pack(tmp_path, sandbox=False)
    _dispatch(pack, tmp_path / "st", mechanism, listener, "--sandbox")
    records = _records(tmp_path / "st")
    assert records["undeclared"]["status"] == "failed"
    assert records["declared"]["status"] == "passed"
    assert all(r["sandbox"] is True for r in records.values())


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_sandboxed_hit_keeps_sandbox_true(tmp_path: Path, mechanism: str, listener: int) -> None:
    pack = _pack(tmp_path)
    for n in (1, 2):
        _dispatch(
            pack, tmp_path / f"st{n}", mechanism, listener, "--target", "declared",
            "--cache", str(tmp_path / "cache"),
        )  # fmt: skip
    record = _records(tmp_path / "st2")["declared"]
    assert record["cached"] is True and record["sandbox"] is True
    dry = _dispatch(
        pack, tmp_path / "st3", mechanism, listener, "--target", "declared",
        "--cache", str(tmp_path / "cache"), "-n", "--all",
    )  # fmt: skip
    assert "cache hit: nothing it depends on changed; sandboxed: its key is complete" in (
        dry.stdout
    )


def test_no_sandbox_available_is_refused_up_front(tmp_path: Path, listener: int) -> None:
    pack = _pack(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    empty = tmp_path / "bin"
    empty.mkdir()
    (empty / "sh").symlink_to("/bin/sh")
    env.update(CRUCIBLE_SANDBOX="bwrap", PATH=str(empty))
    proc = subprocess.run(
        [DISPATCH, str(pack / "pack.toml"), "--state", str(tmp_path / "st")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "crucible-dispatch: error: cannot run sandboxed: CRUCIBLE_SANDBOX=bwrap but bwrap "
        "is not on PATH"
    ]
    assert not (tmp_path / "st").exists()


def test_a_bad_switch_is_refused(tmp_path: Path) -> None:
    pack = _pack(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    env["CRUCIBLE_SANDBOX"] = "chroot"
    proc = subprocess.run(
        [DISPATCH, str(pack / "pack.toml"), "--state", str(tmp_path / "st")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "CRUCIBLE_SANDBOX='chroot': use landlock or bwrap" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_neither_mechanism_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import crucible.run.executors._sandbox as sandbox

    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    with pytest.raises(SandboxUnavailable) as caught:
        choose({"PATH": "/nonexistent"})
    assert str(caught.value) == (
        "neither Landlock (kernel ABI 4 or later) nor bubblewrap (bwrap on PATH) is available"
    )
    if shutil.which("bwrap"):
        assert choose({"PATH": os.environ["PATH"]})[0] == "bwrap"


def test_a_dry_run_of_a_sandboxed_pack_is_not_refused(tmp_path: Path) -> None:
    pack = _pack(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
    env.update(CRUCIBLE_SANDBOX="bwrap", PATH="/nonexistent")
    proc = subprocess.run(
        [sys.executable, "-m", "crucible.run.cli", str(pack / "pack.toml"), "--state",
         str(tmp_path / "st"), "-n"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


AGENT_PACK = """edition = 4

[workflow]
name = "agents"
sandbox = true

[[workflow.task]]
name = "ask"
kind = "agent"
prompt = "Summarise the data."
READS
"""


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_an_agent_runs_under_the_same_rule(tmp_path: Path, mechanism: str, listener: int) -> None:
    pack = _pack(tmp_path)
    agent_cmd = 'cat > /dev/null; cat "$CRUCIBLE_PACK_DIR/data/c.txt"'
    for reads, status in (("", "failed"), ('reads = ["data/c.txt"]', "passed")):
        (pack / "pack.toml").write_text(AGENT_PACK.replace("READS", reads))
        state = tmp_path / f"st-{status}"
        _dispatch(pack, state, mechanism, listener, "--agent-cmd", agent_cmd)
        record = _records(state)["ask"]
        assert record["status"] == status, record.get("note")
        assert record["sandbox"] is True
    assert str(_records(tmp_path / "st-failed")["ask"]["note"]).startswith(
        f"sandbox: permission denied reading {pack / 'data' / 'c.txt'} (not in reads)"
    )


def test_a_worker_without_a_sandbox_fails_the_unit_never_runs_it_unsandboxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that cannot sandbox (a Dask worker on a host without Landlock
    or bwrap, after the dispatcher's own check passed) fails the attempt."""
    import crucible.run.session._admit as admit
    from crucible.run import RunOptions
    from crucible.run.session._runner import run_plan

    pack = _pack(tmp_path)
    monkeypatch.setattr(admit, "_check_sandbox", lambda *_a: None)  # passed on its host
    options = RunOptions(plan=pack / "pack.toml", state=tmp_path / "st", targets=("writer",))
    outcome = run_plan(options, environ={"PATH": "/usr/bin:/bin", "CRUCIBLE_SANDBOX": "chroot"})
    assert outcome.exit_code == 1
    record = _records(tmp_path / "st")["writer"]
    assert str(record["note"]).startswith(
        "cannot start sandboxed: CRUCIBLE_SANDBOX='chroot': use landlock or bwrap"
    )
    assert not (pack / "data" / "written.txt").exists()


def test_a_double_star_entry_is_one_rule_for_its_tree(tmp_path: Path) -> None:
    from crucible.run.executors._sandbox import UnitSandbox

    (tmp_path / "data" / "sub").mkdir(parents=True)
    for i in range(5):
        (tmp_path / "data" / "sub" / f"{i}.csv").write_text("x")
    env = {"CRUCIBLE_SANDBOX": "bwrap", "PATH": "/usr/bin:/bin"}
    box = UnitSandbox(env, str(tmp_path / "state"), str(tmp_path))
    if shutil.which("bwrap") is None:
        pytest.skip("no bwrap")
    task = Task(name="t", kind="command", run="x", reads=("data/**", "data/sub/*.csv"))
    spec = box.spec(task, "/w", "/o", "/dev/null")
    tree = str(tmp_path / "data")
    assert tree in spec.read
    assert len([p for p in spec.read if p.startswith(tree + "/")]) == 5  # the glob's files
    assert spec.list_dirs == [str(tmp_path / "data" / "sub")]
