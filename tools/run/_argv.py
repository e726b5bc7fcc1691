"""``crucible-dispatch PLAN --state DIR [options]`` without click (run.md, "Start-up").

Loading click and building the command's 25 options costs ~20 ms of the ~10 ms
a one-task run spends working, on every run. :func:`parse` reads the common
command lines itself and declines (returns None) every one it is not sure of,
which click then parses (run/_click_cli.py): so help, version, every error
message and exit code stay click's. What it accepts it turns into exactly the
options click would: each value passes the checks click makes (``click.Path``:
a dir given where a file is wanted, or a file where a dir is, or an unreadable
path; ``IntRange``; ``Choice``), else it declines. It declines:

- ``--help``/``-h``, ``--version``, ``--debug``, ``--``, a subcommand other than
  ``run``, a first argument that names nothing (click: "no such command or file");
- an unknown option, combined short options (``-nj2``), a flag given a value, an
  option given twice (only ``-p`` and ``--target`` repeat), a missing value, an
  empty value, or one starting with ``-`` (other than ``-`` itself);
- a number that is not plain ASCII digits, or out of its range;
- no PLAN, or a second positional argument.

``tests/run/test_startup_argv.py`` checks its options against click's over a
grid of command lines, and that it reads every option click's ``run`` has with
click's destination, arity and range (or declines it on purpose).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from crucible.run._options import JOBS_MAX

__all__ = ["parse"]

#: the group's subcommands (run/_click_cli.py)
_SUBCOMMANDS = ("run", "report", "cache")

#: flag -> option name
_FLAGS = {
    "--resume": "resume",
    "--retry-failed": "retry_failed",
    "--fresh": "fresh",
    "--reuse": "reuse",
    "--all": "show_all",
    "-n": "dry_run",
    "--dry-run": "dry_run",
    "--json": "as_json",
    "--fail-fast": "fail_fast",
    "--follow": "follow",
    "--keep-workspaces": "keep_workspaces",
    "--sandbox": "sandbox",
    "--enforce-memory": "enforce_memory",
}

#: option taking a value -> (option name, kind of value)
_VALUED = {
    "--state": ("state", "dir"),
    "--params": ("params_file", "text"),
    "-p": ("params", "texts"),
    "-j": ("jobs", "slots"),
    "--jobs": ("jobs", "slots"),
    "--agent-cmd": ("agent_cmd", "text"),
    "--emit-cap": ("emit_cap", "text"),  # checked at admission (core.contract)
    "--target": ("targets", "texts"),
    "--events": ("events", "text"),
    "--outputs": ("outputs", "text"),
    "--publish-dir": ("publish_dir", "dir"),
    "--cache": ("cache", "path"),
    "--executor": ("executor", "executor"),
    "--scheduler": ("scheduler", "text"),
    "--workers": ("workers", "slots"),
    "--threads-per-worker": ("threads_per_worker", "slots"),
    "--slurm-partition": ("slurm_partition", "text"),
    "--slurm-account": ("slurm_account", "text"),
    "--slurm-qos": ("slurm_qos", "text"),
    "--slurm-extra": ("slurm_extra", "text"),
    "--actor": ("actor", "text"),
}

#: options click also reads from the environment when not given (their envvar)
_FROM_ENV = {
    "slurm_partition": "CRUCIBLE_SLURM_PARTITION",
    "slurm_account": "CRUCIBLE_SLURM_ACCOUNT",
    "slurm_qos": "CRUCIBLE_SLURM_QOS",
    "slurm_extra": "CRUCIBLE_SLURM_EXTRA",
}

#: short options whose value may be attached (``-j2``, ``-pNAME=VALUE``)
_ATTACHED = ("-j", "-p")

_EXECUTORS = ("local", "dask", "dask-local", "slurm")


class _Declined(Exception):
    """Click parses this command line."""


def parse(args: list[str]) -> dict[str, Any] | None:
    """``run``'s option values (the names and values click gives run's command
    function, run/_click_cli.py), or None for a command line click must parse."""
    try:
        return _parse(args)
    except _Declined:
        return None


def _parse(args: list[str]) -> dict[str, Any]:
    if not args:
        raise _Declined
    first = args[0]
    if first == "run":
        rest = args[1:]
    elif first.startswith("-"):
        rest = args  # options before PLAN belong to run (the group's rule)
    elif first in _SUBCOMMANDS or not os.path.lexists(first):
        raise _Declined
    else:
        rest = args
    values: dict[str, Any] = {}
    plan: str | None = None
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-") or token == "-":
            if plan is not None or token == "-" or token == "":
                raise _Declined
            plan = token
            continue
        name, eq, attached = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in _FLAGS:
            if eq or _FLAGS[name] in values:
                raise _Declined
            values[_FLAGS[name]] = True
            continue
        if name not in _VALUED and name[:2] in _ATTACHED and len(name) > 2:
            name, eq, attached = name[:2], "=", name[2:]
        if name not in _VALUED:
            raise _Declined
        if eq:
            value = attached
        elif i < len(rest):
            value = rest[i]
            i += 1
        else:
            raise _Declined
        dest, kind = _VALUED[name]
        converted = _convert(kind, value)
        if kind == "texts":
            values[dest] = (*values.get(dest, ()), converted)
        elif dest in values:
            raise _Declined
        else:
            values[dest] = converted
    if plan is None or "state" not in values:
        raise _Declined
    if "cache" not in values:
        from_env = os.environ.get("CRUCIBLE_CACHE")  # click reads it when --cache is not given
        if from_env:
            values["cache"] = _convert("path", from_env)
    for dest, variable in _FROM_ENV.items():
        if dest not in values and os.environ.get(variable):
            values[dest] = _convert("text", os.environ[variable])
    return _with_defaults(_convert("file", plan), values)


def _with_defaults(plan: Path, values: dict[str, Any]) -> dict[str, Any]:
    """Every parameter of run's command function, unset ones at click's defaults."""
    out: dict[str, Any] = {
        "plan": plan,
        "params_file": None,
        "params": (),
        "jobs": None,
        "agent_cmd": None,
        "emit_cap": None,
        "resume": False,
        "retry_failed": False,
        "fresh": False,
        "reuse": False,
        "dry_run": False,
        "as_json": False,
        "show_all": False,
        "targets": (),
        "fail_fast": False,
        "follow": False,
        "keep_workspaces": False,
        "sandbox": False,
        "events": None,
        "outputs": None,
        "publish_dir": None,
        "cache": None,
        "executor": "local",
        "scheduler": None,
        "workers": None,
        "threads_per_worker": None,
        "enforce_memory": False,
        "slurm_partition": None,
        "slurm_account": None,
        "slurm_qos": None,
        "slurm_extra": None,
        "actor": None,
    }
    out.update(values)
    return out


def _convert(kind: str, value: str) -> Any:
    if value == "" or (value.startswith("-") and value != "-"):
        raise _Declined
    if kind in ("text", "texts"):
        return value
    if kind == "slots":
        if not (value.isascii() and value.isdigit()):
            raise _Declined
        number = int(value)
        if number < 1 or number > JOBS_MAX:
            raise _Declined
        return number
    if kind == "executor":
        if value not in _EXECUTORS:
            raise _Declined
        return value
    return _path(value, file_okay=kind != "dir", dir_okay=kind != "file")


def _path(value: str, *, file_okay: bool, dir_okay: bool) -> Path:
    """``click.Path(path_type=Path, ...)``'s conversion where it passes."""
    try:
        st = os.stat(value)
    except OSError:
        return Path(value)  # a path that need not exist yet
    except ValueError:  # an embedded NUL
        raise _Declined from None
    if not file_okay and stat.S_ISREG(st.st_mode):
        raise _Declined
    if not dir_okay and stat.S_ISDIR(st.st_mode):
        raise _Declined
    if not os.access(value, os.R_OK):
        raise _Declined
    return Path(value)
