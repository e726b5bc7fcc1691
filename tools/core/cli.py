"""The command edge shared by every tool.

:func:`run` invokes a click command and turns every outcome into one exit code
of DESIGN.md: a :class:`CrucibleError` becomes one stderr line
``prog: error: where: message``; an unanticipated exception becomes exit 70 with
a request for a report (traceback only with ``--debug`` or ``CRUCIBLE_DEBUG=1``);
an I/O failure on our own streams (``> /dev/full``) is exit 3; a closed stdout
ends quietly; Ctrl-C is 130.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import crucible
from crucible.core.errors import (
    EXIT_BUG,
    EXIT_OPERATIONAL,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_USAGE,
    CrucibleError,
)

__all__ = ["debug_option", "die", "pause_gc", "resume_gc", "run", "set_debug"]


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


#: set by :func:`pause_gc`: the collector is off for a program's start-up
_gc_paused = False


def pause_gc() -> None:
    """Turn the cyclic garbage collector off for a program's start-up: importing
    ~200 modules and loading the plan allocate tens of thousands of objects that
    live until exit, so the collections they trigger (~6 ms of a one-task
    dispatch) find nothing. :func:`resume_gc` ends the pause."""
    global _gc_paused
    # lazy: not loaded with this module; only pause_gc() needs it
    import gc

    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def resume_gc() -> None:
    """End :func:`pause_gc`'s pause (nothing if none): what start-up allocated is
    frozen (no later collection walks it again, and forked workers do not copy
    the pages a walk would write) and the collector is back on."""
    global _gc_paused
    if _gc_paused:
        # lazy: not loaded with this module; only resume_gc() needs it
        import gc

        _gc_paused = False
        gc.freeze()
        gc.enable()


def die(prog: str, error: CrucibleError) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {error}\n")
    raise SystemExit(error.exit_code)


#: set for one run by ``--debug`` (any command's option), by ``CRUCIBLE_DEBUG=1``
#: or by the umbrella's ``crucible --debug TOOL``: an internal error re-raises
_debug = False
#: the umbrella's request, kept for the run it starts next
_requested = False


def set_debug(on: bool = True) -> None:
    """Debug the next :func:`run` (``crucible --debug TOOL ...``)."""
    global _requested
    _requested = on


def _debug_callback(ctx: Any, param: Any, value: bool) -> None:
    global _debug
    if value:
        _debug = True


DEBUG_HELP = "On an internal error, show the traceback (also CRUCIBLE_DEBUG=1)."


def debug_option(command: Any) -> Any:
    """Give ``command`` (and, for a group, each of its subcommands) a real
    ``--debug`` option. A real option is parsed by click like any other, so a
    ``--debug`` after ``--`` stays in a child's argv (``ledger run -- CMD``)."""
    # lazy: click is heavy; only debug_option() needs it
    import click

    if not any(getattr(p, "name", None) == "debug" for p in command.params):
        command.params.append(
            click.Option(
                ["--debug"],
                is_flag=True,
                expose_value=False,
                is_eager=True,
                callback=_debug_callback,
                help=DEBUG_HELP,
            )
        )
    for sub in getattr(command, "commands", {}).values():
        debug_option(sub)
    return command


def _invoke(command: Any, args: list[str], prog: str) -> Any:
    """click's ``main`` without its exception handling: every outcome reaches
    :func:`run` as the exception it is (click's ``main`` would turn EPIPE into
    exit 1 behind a wrapper and print a blank line on Ctrl-C)."""
    with command.make_context(prog, args) as ctx:
        return command.invoke(ctx)


class Terminated(KeyboardInterrupt):
    """SIGTERM at the command edge: a KeyboardInterrupt, so that every cleanup an
    interrupt runs (temp files, records of an interrupted run) runs for it too;
    the edge says ``interrupted by SIGTERM`` and exits 143."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def _restore_sigint() -> None:
    # crucible/__init__ guards the startup (import time) with handlers that
    # exit 130 / 143 at once; from here a Ctrl-C is a KeyboardInterrupt again,
    # and a SIGTERM its Terminated, so cleanups get to run.
    import crucible

    if signal.getsignal(signal.SIGINT) is crucible._interrupted_early:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is crucible._terminated_early:
        signal.signal(signal.SIGTERM, _raise_terminated)


def _guard_teardown() -> None:
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, crucible._interrupted_early)
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, crucible._terminated_early)
    except ValueError:  # not the main thread
        pass


def _interrupted(prog: str, exc: KeyboardInterrupt) -> NoReturn:
    if isinstance(exc, Terminated):
        sys.stderr.write(f"{prog}: interrupted by SIGTERM\n")
        raise SystemExit(EXIT_SIGTERM) from None
    sys.stderr.write(f"{prog}: interrupted\n")
    raise SystemExit(EXIT_SIGINT) from None


#: a command line the program runs without click (see :func:`run`'s ``fast``):
#: given the arguments, the call that runs them, or None to let click parse them
FastPath = Callable[[list[str]], "Callable[[], int] | None"]


def run(
    command: Any,
    prog: str,
    argv: list[str] | None = None,
    *,
    fast: FastPath | None = None,
    fast_exit: bool = False,
) -> NoReturn:
    """Run a click command as a program named ``prog`` and exit.

    ``command`` is the click command, or a function returning it (so a program
    whose ``fast`` path takes the command line never imports click). ``fast``
    sees the arguments first; what it declines goes to click, which owns every
    usage error and the help text. With ``fast_exit`` the program ends by
    :func:`_exit_now` (the interpreter's teardown of every module skipped),
    for a program, never for a library call."""
    try:
        _run(command, prog, argv, fast)
    except SystemExit as exc:
        if fast_exit:
            _guard_teardown()
            _exit_now(exc, prog)
        raise
    finally:
        # a Ctrl-C while the interpreter winds down is still one line and 130
        _guard_teardown()


def _exit_now(exc: SystemExit, prog: str) -> None:
    """End the process with ``exc``'s code without the interpreter's teardown
    (~15 ms of deallocating and collecting every imported module's objects at
    the end of each dispatch): the atexit handlers run, the standard streams
    are flushed, then ``os._exit``. Returns (the caller re-raises ``exc``, the
    normal exit) whenever that would differ from a normal exit: a code that is
    not an int, a non-daemon thread still running (the interpreter would join
    it), threading's own exit hooks pending, or a stream whose flush fails (the
    interpreter reports that and changes the code)."""
    code = exc.code if exc.code is not None else 0
    if not isinstance(code, int) or not 0 <= code <= 255:
        return
    threading = sys.modules.get("threading")
    if threading is not None:
        if getattr(threading, "_threading_atexits", None):
            return
        main = threading.main_thread()
        if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
            return
    if not _flushed():
        return
    # lazy: not loaded with this module; only _exit_now() needs it
    import atexit

    atexit._run_exitfuncs()
    if not _flushed():  # what a handler printed
        return
    if os.environ.get(CHECK_EXIT_ENV) == "1" and _left_open(prog):
        raise SystemExit(EXIT_BUG)  # the normal exit, which flushes them
    os._exit(code)


#: set to 1 (the test suite does), the fast exit first looks for a writable
#: file object the program left open and, finding one, says so and exits with
#: EXIT_BUG through the normal teardown instead (which flushes it): ``os._exit``
#: would drop what its buffer holds. Off by default: the look costs ~1-2 ms
CHECK_EXIT_ENV = "CRUCIBLE_CHECK_EXIT"


def _left_open(prog: str) -> bool:
    """Whether a writable file object other than the standard streams is still
    open; if so, says which on stderr."""
    # lazy: not loaded with this module; only _left_open() needs it
    import gc

    gc.unfreeze()  # what start-up froze (pause_gc) is looked at too
    std = set()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        while stream is not None:  # a wrapper, its text stream, its buffer
            std.add(id(stream))
            stream = getattr(stream, "_stream", None) or getattr(stream, "buffer", None)
    # a bare FileIO has no buffer to lose
    kinds = (io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper)

    def open_for_writing(obj: Any) -> bool:
        try:
            return not obj.closed and bool(obj.writable())
        except ValueError:  # a text wrapper whose buffer was detached
            return False

    left = [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, kinds) and id(obj) not in std and open_for_writing(obj)
    ]
    if not left:
        return False
    names = ", ".join(sorted({str(getattr(f, "name", "?")) for f in left}))
    sys.stderr.write(f"{prog}: bug: left open at exit: {names}\n")
    sys.stderr.flush()
    return True


def _flushed() -> bool:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            return False
    return True


class _NoClick:
    """Stands in for ``click.exceptions`` while click is not loaded (a fast path
    ran): its classes are never raised, so those handlers never match."""

    class _Never(Exception):
        ctx: Any = None
        exit_code = 0

    Abort = NoArgsIsHelpError = UsageError = ClickException = Exit = _Never


def _run(command: Any, prog: str, argv: list[str] | None, fast: FastPath | None) -> NoReturn:
    global _debug
    ce: Any = _NoClick
    try:
        _restore_sigint()
        _standard_fds()
        if not isinstance(sys.stderr, _StderrSurvivingEpipe):
            sys.stderr = _StderrSurvivingEpipe(sys.stderr)  # type: ignore[assignment]
        args = list(sys.argv[1:] if argv is None else argv)
        _debug = _requested or os.environ.get("CRUCIBLE_DEBUG") == "1"
    except KeyboardInterrupt as exc:
        _interrupted(prog, exc)
    try:
        call = fast(args) if fast is not None else None
        if call is not None:
            result: Any = call()
        else:
            # lazy: click is heavy; only _run() needs it
            import click.exceptions as ce

            if not hasattr(command, "make_context"):
                command = command()
            debug_option(command)
            result = _invoke(command, args, prog)
        sys.stdout.flush()
    except CrucibleError as exc:
        if _debug:
            raise
        die(prog, exc)
    except ce.Abort:
        sys.stderr.write(f"{prog}: interrupted\n")
        raise SystemExit(EXIT_SIGINT) from None
    except ce.NoArgsIsHelpError as exc:
        # A group given no subcommand: one line, like every other error, not
        # the whole help block (issue 12 item 30).
        name = exc.ctx.command_path if exc.ctx is not None else prog
        sys.stderr.write(f"{name}: error: missing command (see '{name} --help')\n")
        raise SystemExit(EXIT_USAGE) from None
    except ce.UsageError as exc:
        # One line, like every other error (cli.md), not click's three-line block.
        name = exc.ctx.command_path if exc.ctx is not None else prog
        sys.stderr.write(f"{name}: error: {exc.format_message()} (see '{name} --help')\n")
        raise SystemExit(EXIT_USAGE) from None
    except ce.ClickException as exc:
        exc.show()
        raise SystemExit(EXIT_USAGE if exc.exit_code == 2 else exc.exit_code) from None
    except ce.Exit as exc:
        if exc.exit_code == 0:
            _flush_stdout()
        raise SystemExit(exc.exit_code) from None
    except BrokenPipeError:
        _quiet_broken_pipe()
    except KeyboardInterrupt as exc:
        _interrupted(prog, exc)
    except OSError as exc:
        # An unanticipated I/O failure (a full disk under stdout, EIO) is
        # operational, not a bug.
        if _debug:
            raise
        _os_error(prog, exc)
    except Exception as exc:
        if _debug:
            raise
        sys.stderr.write(
            f"{prog}: internal error: {type(exc).__name__}: {exc} "
            f"(a bug; please report it with the output of the same command run with --debug)\n"
        )
        raise SystemExit(EXIT_BUG) from None
    code = result if isinstance(result, int) else 0
    raise SystemExit(code)


def _flush_stdout() -> None:
    """Flush what click printed (``--help``, ``--version``) here, where a failure
    still gets its exit code, not at interpreter exit."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    except OSError as exc:
        _os_error(os.path.basename(sys.argv[0]), exc)


def _os_error(prog: str, exc: OSError) -> NoReturn:
    _silence_stdout()
    where = f"{exc.filename}: " if exc.filename else ""
    sys.stderr.write(f"{prog}: error: {where}I/O error: {exc.strerror or exc}\n")
    raise SystemExit(EXIT_OPERATIONAL) from None
