"""Issue 27 item 10: Dask set-up errors were internal errors (exit 70, a
traceback's last line). Each is now one line with the documented exit code
(docs/spec/cli.md): a malformed Dask config file (2, located), a temporary
directory that is a file (2), an unknown scheduler address scheme (2), all
refused before the state directory is claimed; a worker that cannot load
crucible, runs another version of it or cannot see the pack directory (3,
naming the worker). A scheduler whose ``allowed-failures`` is not 0 is warned
about. Real ``dask scheduler`` and ``dask worker`` processes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.run.dasktests import LOCAL, cluster, dispatch, start_worker, wait_workers
from tests.run.dispatchtests import DISPATCH, write_pack

pytest.importorskip("distributed")

PACK = """
edition = 4
[workflow]
name = "setup"
[[workflow.task]]
name = "t"
run = 'echo "{}" > "$CRUCIBLE_OUTPUT"'
"""


def dispatch_env(
    pack: Path, state: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def one_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr
    return proc.stderr


def test_a_malformed_dask_config_is_located_exit_2_before_the_claim(tmp_path: Path) -> None:
    config = tmp_path / "dask"
    config.mkdir()
    (config / "bad.yaml").write_text("distributed:\n  a: [1\n")
    pack = write_pack(tmp_path, PACK)
    state = tmp_path / "state"
    err = one_line(dispatch_env(pack, state, {"DASK_CONFIG": str(config)}, *LOCAL), 2)
    assert f"{config / 'bad.yaml'}:3:1: malformed Dask config (YAML: " in err
    assert not state.exists()


def test_a_temporary_directory_that_is_a_file_is_exit_2_before_the_claim(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.write_text("a file")
    pack = write_pack(tmp_path, PACK)
    state = tmp_path / "state"
    err = one_line(
        dispatch_env(pack, state, {"DASK_TEMPORARY_DIRECTORY": str(scratch)}, *LOCAL), 2
    )
    assert f"{scratch}: Dask's temporary directory" in err
    assert not state.exists()


def test_an_unknown_scheduler_scheme_is_exit_2_before_the_claim(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, PACK)
    state = tmp_path / "state"
    err = one_line(dispatch(pack, state, "--executor", "dask", "--scheduler", "bogus://x"), 2)
    assert "--scheduler bogus://x: unknown address scheme 'bogus' (Dask dials " in err
    assert "tcp://" in err
    assert not state.exists()


@pytest.mark.parametrize(
    ("preload", "says"),
    [
        ('import sys\nsys.modules["crucible"] = None\n', "cannot run crucible's code"),
        ('import crucible\ncrucible.__version__ = "0.0.0+other"\n', "runs crucible 0.0.0+other"),
    ],
    ids=["no-crucible", "other-version"],
)
def test_a_worker_without_this_crucible_is_named_exit_3(
    tmp_path: Path, preload: str, says: str
) -> None:
    script = tmp_path / "preload.py"
    script.write_text(preload)
    pack = write_pack(tmp_path, PACK)
    state = tmp_path / "state"
    with cluster(tmp_path) as (address, procs):
        procs.append(start_worker(address, preload=script))
        wait_workers(address, 1)
        proc = dispatch(pack, state, "--executor", "dask", "--scheduler", address)
    err = one_line(proc, 3)
    assert "Dask worker tcp://127.0.0.1:" in err and says in err
    # refused before the session's first event: the state is left unclaimed,
    # so the same command works once the worker is fixed (issue 27 items 10, 12)
    assert not state.exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)
def test_a_worker_that_cannot_see_the_pack_directory_is_exit_3(tmp_path: Path) -> None:
    """A real worker in another mount namespace where a tmpfs hides the pack
    directory (the state directory stays visible)."""
    packs = tmp_path / "packs"
    packs.mkdir()
    pack = write_pack(packs, PACK)
    state = tmp_path / "state"
    with cluster(tmp_path) as (address, procs):
        procs.append(start_worker(address, hide=packs))
        wait_workers(address, 1)
        proc = dispatch(pack, state, "--executor", "dask", "--scheduler", address)
    err = one_line(proc, 3)
    assert f"{packs}: Dask worker tcp://127.0.0.1:" in err
    assert "cannot see the pack directory" in err
    assert not state.exists()


def test_a_scheduler_that_reruns_lost_units_itself_is_warned_about(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, PACK)
    with cluster(tmp_path, allowed_failures=3) as (address, procs):
        procs.append(start_worker(address))
        wait_workers(address, 1)
        proc = dispatch(pack, tmp_path / "state", "--executor", "dask", "--scheduler", address)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == (
        f"crucible-dispatch: warning: the Dask scheduler {address} has allowed-failures 3:"
        " it may rerun a lost worker's unit behind the dispatcher's back; set"
        " distributed.scheduler.allowed-failures to 0 there"
    )
    assert lines[1].startswith("crucible-dispatch: run passed: 1 passed")
