"""Sessions: tests, lint (ruff + mypy), bench (ratios against same-run baselines)."""

from __future__ import annotations

import glob
import os
import tempfile

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("ruff", "check", "tools", "tests", "benchmarks", "noxfile.py")
    # tools/ is the package crucible; give mypy that name through a symlink so it
    # checks the source tree (an editable install hides it behind a finder).
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(os.path.abspath("tools"), os.path.join(tmp, "crucible"))
        session.run("mypy", "-p", "crucible", env={"MYPYPATH": tmp})


@nox.session
def bench(session: nox.Session) -> None:
    """Each benchmarks/bench_*.py prints its ratios and exits 1 if over its budget."""
    # doit: measured beside make on the dispatcher's workload (no budget; issue 4)
    session.install(".[test]", "doit>=0.36")
    scripts = sorted(glob.glob("benchmarks/bench_*.py"))
    wanted = set(session.posargs)
    failed = []
    for script in scripts:
        if wanted and not any(w in script for w in wanted):
            continue
        try:
            session.run("python", script)
        except nox.command.CommandFailed:
            failed.append(script)
    if failed:
        session.error(f"over budget: {', '.join(failed)}")
