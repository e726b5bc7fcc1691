"""``crucible-dispatch``'s click commands: run a plan, or report on a state dir.
Click only: each verb builds its options and calls its ``run_<verb>`` in
:mod:`crucible.run.commands`. The program's entry is :mod:`crucible.run.cli`,
which runs a plain ``PLAN --state DIR`` command line without loading click
(:mod:`crucible.run._argv`) and hands every other one to these commands.

``crucible-dispatch PLAN --state DIR ...`` and ``crucible-dispatch run PLAN ...``
are the same command: a first argument that is not a subcommand name is taken
as the PLAN of ``run``. (A plan file literally named ``report`` or ``run``:
write ``./report``.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from crucible import __version__
from crucible.run._options import JOBS_MAX

__all__ = ["cli"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _flag(*decls: str, help: str) -> Callable[[_F], _F]:
    """A boolean option: ``--x`` present or not (most of run's options)."""
    return click.option(*decls, is_flag=True, help=help)


def _cache_option(help: str) -> Callable[[_F], _F]:
    """``--cache DIR`` (``$CRUCIBLE_CACHE``): run's and the cache commands'."""
    return click.option(
        "--cache",
        "cache",
        type=click.Path(path_type=Path),
        envvar="CRUCIBLE_CACHE",
        metavar="DIR",
        help=help,
    )


class _DefaultRunGroup(click.Group):
    """A group whose unknown first argument means ``run <it>``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            if not os.path.lexists(args[0]):
                # A typo of a subcommand (``reprot``) must not become a run's
                # "Missing option '--state'".
                from crucible.core.errors import UsageError

                raise UsageError(f"no such command or file: {args[0]}")
            args = ["run", *args]
        elif args and args[0].startswith("-") and args[0] not in ("--help", "-h", "--version"):
            # Options before PLAN (``crucible-dispatch --state s plan.json``) belong to run.
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultRunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="crucible-dispatch")
def cli() -> None:
    """Run a crucible plan (or manifest) end to end, or report on a run.

    \b
    crucible-dispatch PLAN --state DIR [options]     run (same as `run PLAN`)
    crucible-dispatch report STATE [TASK] [--html FILE]

    Exit codes: 0 every task passed; 1 a task failed or was skipped, or the input
    was refused (bad params, PlanChanged, a state dir of another plan); 2 usage or
    unparseable input; 3 I/O failure; 130/143 interrupted (resume with --resume).
    """


@cli.command("run")
@click.argument("plan", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--state",
    "state",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Run state directory.",
)
@click.option(
    "--params", "params_file", metavar="FILE", help="Params as a JSON object (- for stdin)."
)
@click.option(
    "-p",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    help="One param (repeatable; overrides --params).",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1, max=JOBS_MAX),
    help=f"Tasks run at once (default: CPU count; at most {JOBS_MAX}, and the unit count).",
)
@click.option("--agent-cmd", metavar="CMD", help="Agent stand-in command line, run with sh -c.")
@click.option(
    "--emit-cap",
    metavar="BYTES",
    help="Cap per declared emits field (default $CRUCIBLE_EMIT_CAP or 65536).",
)
@_flag("--resume", help="Continue the run in --state; refuses if the plan changed.")
@_flag(
    "--retry-failed", help="With --resume: failed and skipped units, and all downstream, run again."
)
@_flag("--fresh", help="Start over; an earlier run in --state moves to STATE.prev.")
@_flag(
    "--reuse",
    help="After an edit: start over as --fresh, reusing each unit of the earlier run "
    "whose cache key did not change.",
)
@_flag("-n", "--dry-run", help="Print what would run and why; run nothing.")
@_flag("--json", "as_json", help="With --dry-run: NDJSON lines on stdout.")
@_flag("--all", "show_all", help="With --dry-run: list every unit, not only those that run.")
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="NAME",
    help="Run only NAME and its ancestors (repeatable).",
)
@_flag("--fail-fast", help="Stop at the first failure (running tasks are stopped).")
@_flag("--follow", help="Stream task output lines to stderr, prefixed task[key].")
@_flag(
    "--keep-workspaces",
    help="Keep every unit's workspace (passed fan-out instances' are otherwise recycled).",
)
@_flag(
    "--sandbox",
    help="Run every task sandboxed: it reads only system dirs, its inputs and its reads.",
)
@click.option(
    "--events", metavar="FILE|-", help="Also write the session events to FILE (- = stdout)."
)
@click.option(
    "--outputs",
    "outputs",
    metavar="FILE|-",
    help="At the end, also write the run results (STATE/outputs.json) to FILE (- = stdout).",
)
@click.option(
    "--publish-dir",
    type=click.Path(path_type=Path, file_okay=False),
    metavar="DIR",
    help="At the end, publish the [workflow.publish] files into DIR.",
)
@_cache_option("Task cache: reuse passed results whose inputs did not change ($CRUCIBLE_CACHE).")
@click.option(
    "--executor",
    type=click.Choice(["local", "dask", "dask-local", "slurm"]),
    default="local",
    show_default=True,
    help="Where units run: forked workers, a Dask cluster, a LocalCluster for the run,"
    " or SLURM job arrays.",
)
@click.option("--scheduler", metavar="tcp://HOST:PORT", help="With --executor dask: its scheduler.")
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=JOBS_MAX),
    help="With --executor dask-local: worker processes (default: min(-j, CPU count)).",
)
@click.option(
    "--threads-per-worker",
    type=click.IntRange(min=1, max=JOBS_MAX),
    help="With --executor dask-local: Dask threads per worker (default: its share of -j"
    " plus its share of the units staged ahead).",
)
@_flag(
    "--enforce-memory",
    help="Limit each task to its resources.memory (RLIMIT_DATA): an allocation past it fails.",
)
@click.option(
    "--slurm-partition",
    envvar="CRUCIBLE_SLURM_PARTITION",
    metavar="NAME",
    help="With --executor slurm: the partition (default: the cluster's).",
)
@click.option(
    "--slurm-account", envvar="CRUCIBLE_SLURM_ACCOUNT", metavar="NAME",
    help="With --executor slurm: the account jobs are charged to.",
)  # fmt: skip
@click.option(
    "--slurm-qos", envvar="CRUCIBLE_SLURM_QOS", metavar="NAME",
    help="With --executor slurm: the quality of service.",
)  # fmt: skip
@click.option(
    "--slurm-extra",
    envvar="CRUCIBLE_SLURM_EXTRA",
    metavar="ARGS",
    help="With --executor slurm: more sbatch options (not --output, --wrap, --array, ...).",
)
@click.option(
    "--actor",
    metavar="NAME",
    help="Who asserts an accounted run's selections and retries (default: the login name).",
)
def run_cmd(
    plan: Path,
    state: Path,
    params_file: str | None,
    params: tuple[str, ...],
    jobs: int | None,
    agent_cmd: str | None,
    emit_cap: str | None,
    resume: bool,
    retry_failed: bool,
    fresh: bool,
    reuse: bool,
    dry_run: bool,
    as_json: bool,
    show_all: bool,
    targets: tuple[str, ...],
    fail_fast: bool,
    follow: bool,
    keep_workspaces: bool,
    sandbox: bool,
    events: str | None,
    outputs: str | None,
    publish_dir: Path | None,
    cache: Path | None,
    executor: str,
    scheduler: str | None,
    workers: int | None,
    threads_per_worker: int | None,
    enforce_memory: bool,
    slurm_partition: str | None,
    slurm_account: str | None,
    slurm_qos: str | None,
    slurm_extra: str | None,
    actor: str | None,
) -> int:
    """Run PLAN (a plan JSON file or a pack manifest .toml) with its state in --state."""
    # lazy: run.commands is not loaded with this module; only run_cmd() needs it
    from crucible.run.commands import dispatch_options, run_run

    options = dispatch_options(
        plan=plan,
        state=state,
        params_file=params_file,
        params=params,
        jobs=jobs,
        agent_cmd=agent_cmd,
        emit_cap=emit_cap,
        resume=resume,
        retry_failed=retry_failed,
        fresh=fresh,
        reuse=reuse,
        dry_run=dry_run,
        as_json=as_json,
        show_all=show_all,
        targets=targets,
        fail_fast=fail_fast,
        follow=follow,
        keep_workspaces=keep_workspaces,
        sandbox=sandbox,
        events=events,
        outputs=outputs,
        publish_dir=publish_dir,
        cache=cache,
        executor=executor,
        scheduler=scheduler,
        workers=workers,
        threads_per_worker=threads_per_worker,
        enforce_memory=enforce_memory,
        slurm_partition=slurm_partition,
        slurm_account=slurm_account,
        slurm_qos=slurm_qos,
        slurm_extra=slurm_extra,
        actor=actor,
    )
    return run_run(options, sys.stdout.buffer, sys.stderr)


@cli.command("report")
@click.argument("state", type=click.Path(path_type=Path, file_okay=False))
@click.argument("task", required=False)
@click.option(
    "--html",
    "html_file",
    metavar="FILE",
    help="Write a self-contained HTML timeline to FILE (- = stdout).",
)
@_flag("--json", "as_json", help="NDJSON rows on stdout instead of a table.")
@click.option(
    "--tsv",
    "tsv_file",
    metavar="FILE",
    help="Write a trace (one line per attempt, Nextflow's trace fields) to FILE (- = stdout).",
)
def report_cmd(
    state: Path, task: str | None, html_file: str | None, as_json: bool, tsv_file: str | None
) -> int:
    """Summarise the run in STATE: one row per task (per instance with TASK)."""
    # lazy: run.commands is not loaded with this module; only report_cmd() needs it
    from crucible.run.commands import ReportOptions, run_report

    options = ReportOptions(state, task, html_file, as_json, tsv_file)
    return run_report(options, sys.stdout.buffer, sys.stderr)


@cli.group("cache")
def cache_group() -> None:
    """Inspect and trim a task cache (docs/spec/cache.md)."""


_CACHE_OPTION = _cache_option("The task cache directory ($CRUCIBLE_CACHE).")


@cache_group.command("forget")
@click.argument("task")
@_CACHE_OPTION
def cache_forget(task: str, cache: Path | None) -> int:
    """Drop every cached result of TASK (it runs again next time)."""
    # lazy: run.commands is not loaded with this module; only cache_forget() needs it
    from crucible.run.commands import CacheForgetOptions, run_cache_forget

    return run_cache_forget(CacheForgetOptions(task, cache), sys.stdout.buffer, sys.stderr)


@cache_group.command("gc")
@_CACHE_OPTION
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Keep store files younger than this (a running dispatcher's new files).",
)
def cache_gc(cache: Path | None, grace: float) -> int:
    """Remove store files that no cached result names."""
    # lazy: run.commands is not loaded with this module; only cache_gc() needs it
    from crucible.run.commands import CacheGcOptions, run_cache_gc

    return run_cache_gc(CacheGcOptions(cache, grace), sys.stdout.buffer, sys.stderr)
