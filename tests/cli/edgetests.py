"""Helpers shared by the CLI tests: a command run through the command edge in a
forked child that obeys file permissions."""

from __future__ import annotations

import os
import sys
import tempfile

import click


def as_nobody(command: click.Command, prog: str, argv: list[str]) -> tuple[int, str]:
    """``prog ARGV`` through ``crucible.core.cli.run`` in a forked child that drops
    to nobody once the interpreter is loaded (root ignores file permissions);
    the exit code and what it wrote to stderr."""
    from crucible.core.cli import run as run_edge

    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 70
            try:
                os.dup2(err.fileno(), 2)
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                run_edge(command, prog, argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), err.read().decode()
