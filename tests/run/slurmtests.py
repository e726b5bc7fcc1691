"""Helpers shared by the SLURM executor tests (issue 30): the single-node
cluster of ci/slurm-up.sh on this host, started once per test session (the
tests skip, saying why, where it cannot start: not root, SLURM not
installed), and what the tests ask it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from crucible.run.executors._usage import USAGE_FIELDS
from tests.run.dispatchtests import REPO

SLURM = ("--executor", "slurm")
_UP = REPO / "ci" / "slurm-up.sh"


def start_cluster() -> str | None:
    """None once the local cluster answers, else why it cannot start."""
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (ci/slurm-up.sh)"
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        return "SLURM is not installed (ci/slurm-up.sh installs slurm-wlm and munge)"
    done = subprocess.run(
        [str(_UP)],
        env={**os.environ, "CRUCIBLE_SLURM_NO_INSTALL": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"ci/slurm-up.sh could not start SLURM: {lines[-1] if lines else done.returncode}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    reason = start_cluster()
    if reason is not None:
        pytest.skip(reason)


def crucible_jobs(state: str = "") -> list[tuple[str, str]]:
    """(element id, state) of every crucible job in the queue (``-t`` ``state``)."""
    argv = ["squeue", "-h", "-r", "-o", "%i|%j|%T"]
    if state:
        argv += ["-t", state]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    jobs = []
    for line in out.splitlines():
        element, name, status = line.strip().split("|")
        if name.startswith("crucible-"):
            jobs.append((element, status))
    return jobs


def wait_no_jobs(seconds: float = 30) -> list[tuple[str, str]]:
    """Until squeue lists no crucible job; what it still lists then."""
    deadline = time.monotonic() + seconds
    left = crucible_jobs()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = crucible_jobs()
    return left


def hostname() -> str:
    return subprocess.run(
        ["hostname", "-s"], capture_output=True, text=True, check=True
    ).stdout.strip()


def paths_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def tree(root: Path) -> dict[str, object]:
    """Every file's bytes under ``root``; a packed records file's records by
    key (its lines' order is the order units settled in)."""
    from tests.packed import keyed

    if not root.exists():
        return {}
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        if p.suffix == ".jsonl":
            out[str(p.relative_to(root))] = {
                k: _without_usage(r) for k, r in keyed(root.parent, p.stem).items()
            }
        elif root.name == "results":
            out[str(p.relative_to(root))] = _without_usage(json.loads(p.read_bytes()))
        else:
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _without_usage(record: object) -> object:
    """A record without what its attempt cost (measured: differs run to run)."""
    if isinstance(record, dict):
        return {k: v for k, v in record.items() if k != "usage"}
    return record


_VARYING = {
    "time", "pid", "worker", "duration", "max_rss_kib", "worker_max_rss_kib", "session",
    *USAGE_FIELDS,
}


def event_contents(state: Path) -> list[str]:
    """The session's events without timings, pids and worker names, sorted."""
    import json

    from tests.run.dispatchtests import events

    out = []
    for e in events(state):
        kept = {k: v for k, v in e.items() if k not in _VARYING}
        out.append(json.dumps(kept, sort_keys=True))
    return sorted(out)
