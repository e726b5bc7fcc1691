"""The command edge shared by every tool.

:func:`run` invokes a click command and turns every outcome into one exit code
of DESIGN.md: a :class:`CrucibleError` becomes one stderr line
``prog: error: where: message``; an unanticipated exception becomes exit 70 with
a request for a report (traceback only with ``--debug`` or ``CRUCIBLE_DEBUG=1``);
an I/O failure on our own streams (``> /dev/full``) is exit 3; a closed stdout
ends quietly; Ctrl-C is 130.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from crucible.core.errors import (
    EXIT_BUG,
    EXIT_OPERATIONAL,
    EXIT_SIGINT,
    EXIT_USAGE,
    CrucibleError,
)

__all__ = ["die", "run"]


def _silence_stdout() -> None:
    # Python flushes stdout at exit; point it at devnull so that flush is silent.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass


def _quiet_broken_pipe() -> NoReturn:
    _silence_stdout()
    raise SystemExit(0)


def _standard_fds() -> None:
    """A closed fd 0/1/2 (``cmd >&-``) becomes /dev/null, so nothing we open
    later lands on it by accident and writes to it do not fail."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115


class _StderrSurvivingEpipe:
    """stderr whose reader has gone: messages are dropped, the exit code is kept
    (a closed stderr must not turn exit 1 into the quiet exit 0 of a closed stdout)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(text)
                self._stream.flush()
            except BrokenPipeError:
                self._gone = True
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def die(prog: str, error: CrucibleError) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {error}\n")
    raise SystemExit(error.exit_code)


def run(command: Any, prog: str, argv: list[str] | None = None) -> NoReturn:
    """Run a click command as a program named ``prog`` and exit."""
    import click

    _standard_fds()
    if not isinstance(sys.stderr, _StderrSurvivingEpipe):
        sys.stderr = _StderrSurvivingEpipe(sys.stderr)  # type: ignore[assignment]
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("CRUCIBLE_DEBUG") == "1"
    if "--debug" in args:
        args.remove("--debug")
        debug = True
    try:
        result = command.main(args=args, prog_name=prog, standalone_mode=False)
        sys.stdout.flush()
    except CrucibleError as exc:
        if debug:
            raise
        die(prog, exc)
    except click.exceptions.Abort:
        sys.stderr.write(f"{prog}: interrupted\n")
        raise SystemExit(EXIT_SIGINT) from None
    except click.exceptions.UsageError as exc:
        # One line, like every other error (cli.md), not click's three-line block.
        name = exc.ctx.command_path if exc.ctx is not None else prog
        sys.stderr.write(f"{name}: error: {exc.format_message()} (see '{name} --help')\n")
        raise SystemExit(EXIT_USAGE) from None
    except click.exceptions.ClickException as exc:
        exc.show()
        raise SystemExit(EXIT_USAGE if exc.exit_code == 2 else exc.exit_code) from None
    except click.exceptions.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except BrokenPipeError:
        _quiet_broken_pipe()
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        raise SystemExit(EXIT_SIGINT) from None
    except SystemExit as exc:
        # click turns EPIPE on stdout into exit 1 after swapping in its
        # PacifyFlushWrapper; a closed stdout must end quietly instead.
        if exc.code == 1 and "PacifyFlushWrapper" in type(sys.stdout).__name__:
            _quiet_broken_pipe()
        raise
    except OSError as exc:
        # An unanticipated I/O failure (a full disk under stdout, EIO) is
        # operational, not a bug.
        if debug:
            raise
        _silence_stdout()
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"{prog}: error: {where}I/O error: {exc.strerror or exc}\n")
        raise SystemExit(EXIT_OPERATIONAL) from None
    except Exception as exc:
        if debug:
            raise
        sys.stderr.write(
            f"{prog}: internal error: {type(exc).__name__}: {exc} "
            f"(a bug; please report it with the output of the same command run with --debug)\n"
        )
        raise SystemExit(EXIT_BUG) from None
    code = result if isinstance(result, int) else 0
    raise SystemExit(code)
