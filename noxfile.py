"""Sessions: tests, lint (ruff + mypy), bench (ratios against same-run baselines)."""

from __future__ import annotations

import glob

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    # An editable install is not byte-compiled, and under PYTHONDONTWRITEBYTECODE
    # every command a test starts would compile its modules again (~0.3 s each).
    session.run("python", "-m", "compileall", "-q", "tools")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("ruff", "check", "tools", "tests", "benchmarks", "noxfile.py")
    # src/crucible -> ../tools is the package (mypy_path = "src" in pyproject.toml)
    session.run("mypy", "-p", "crucible")
    session.run("mypy", "tests", "benchmarks")


@nox.session
def bench(session: nox.Session) -> None:
    """Each benchmarks/bench_*.py prints its ratios and exits 1 if over its budget."""
    # doit: measured beside make on the dispatcher's workload (no budget; issue 4);
    # the dask extra: bench_dask skips without it
    session.install(".[test,dask]", "doit>=0.36")
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
