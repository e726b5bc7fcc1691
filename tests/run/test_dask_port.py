"""``--executor dask-local`` keeps off the well-known port 8787: its
scheduler's HTTP server (started even without a dashboard) took 8787 when
free, and when another cluster held it Dask printed a three-line warning on
the dispatcher's stderr (a Dask test then failed its one-line check)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.run.dasktests import LOCAL
from tests.run.dispatchtests import DISPATCH, write_pack

pytest.importorskip("distributed")

_PORT = 8787


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(inode)
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:[") : -1])
    return found


def test_the_local_cluster_listens_on_no_well_known_port(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.write_text("closed")
    started = tmp_path / "started"
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "port"
        [[workflow.task]]
        name = "t"
        run = 'touch {started}; while [ -e {gate} ]; do sleep 0.05; done; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    with (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            [DISPATCH, str(pack), "--state", str(tmp_path / "s"), *LOCAL],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not started.exists() and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), (tmp_path / "stderr").read_text()
        # the scheduler runs in the dispatcher's process
        assert not _listening_inodes(_PORT) & _socket_inodes(proc.pid)
    finally:
        gate.unlink()
        code = proc.wait(timeout=60)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0 and stderr.count("\n") == 1 and "run passed" in stderr, stderr
