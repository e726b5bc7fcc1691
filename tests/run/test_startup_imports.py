"""A plain plan-file dispatch loads only what it needs (issue 14, start-up; run.md
"Start-up"): no click (its command line is read by run/_argv.py), nothing only
loops, Dask, the cache, report, progress or compiling a manifest need, and none
of the stdlib modules it was cut loose from. Checked over the whole process
tree with ``-X importtime``: the dispatcher and its forked workers (a worker's
first spawn used to load shutil)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run.test_startup_argv import one_task

#: what a plain run of a plan file must not import, in any of its processes
NOT_ON_THE_PLAIN_PATH = (
    # the command line: click and what only its help and errors need
    "click",
    "crucible.run._click_cli",
    "difflib",
    "gettext",
    # compiling a manifest, locating its diagnostics
    "tomllib",
    "crucible.compile._manifest",
    "crucible.compile._locate",
    # what only other features need
    "crucible.run.loop._engine",
    "crucible.run.executors.dask._executor",
    "crucible.run.executors.slurm._executor",
    "crucible.run.executors.slurm._node",
    "crucible.run.executors.slurm._cli",
    "crucible.run.cache._store",
    "crucible.run.cache._explain",
    "crucible.run.report._report",
    "crucible.run._commands_state",
    "crucible.run.engine._progress",
    "crucible.run.session._publish",
    "ctypes",  # syncfs: only for a batch of many files
    # stdlib modules start-up was cut loose from
    "tempfile",
    "shutil",
    "random",
    "bz2",
    "lzma",
    "traceback",
    "textwrap",
    "subprocess",
    "networkx",
    "rich",
)

#: what it does import (so the probe is not vacuous)
ON_THE_PLAIN_PATH = ("crucible.run.engine._dispatcher", "crucible.run._argv", "crucible.stage._capture")

PROBE = """
import sys
sys.argv[0] = "crucible-dispatch"
from crucible.run.cli import main
main()
"""


def _imported(tmp_path: Path, *args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "CRUCIBLE_CACHE"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_plain_plan_file_dispatch_imports_nothing_heavy(tmp_path: Path, jobs: str) -> None:
    (tmp_path / "plan.json").write_text(one_task('printf \\"{}\\" > \\"$CRUCIBLE_OUTPUT\\"'))
    names = _imported(tmp_path, "plan.json", "--state", "s", "-j", jobs)
    assert set(ON_THE_PLAIN_PATH) <= names
    assert sorted(set(NOT_ON_THE_PLAIN_PATH) & names) == []
    assert (tmp_path / "s" / "results" / "t.json").is_file()


def test_a_command_line_the_fast_path_declines_still_runs_through_click(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(one_task("true"))
    names = _imported(tmp_path, "plan.json", "--state", "s", "--debug")
    assert "click" in names
    assert (tmp_path / "s" / "results" / "t.json").is_file()
