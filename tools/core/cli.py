"""The command edge shared by every tool.

:func:`run` invokes a click command and turns every outcome into one exit code
of DESIGN.md: a :class:`CrucibleError` becomes one stderr line
``prog: error: where: message``; an unanticipated exception becomes exit 70 with
a request for a report (traceback only with ``--debug`` or ``CRUCIBLE_DEBUG=1``);
a closed stdout ends quietly; Ctrl-C is 130.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from crucible.core.errors import EXIT_BUG, EXIT_SIGINT, EXIT_USAGE, CrucibleError

__all__ = ["die", "run"]


def _quiet_broken_pipe() -> NoReturn:
    # Python flushes stdout at exit; point it at devnull so that flush is silent.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    raise SystemExit(0)


def die(prog: str, error: CrucibleError) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {error}\n")
    raise SystemExit(error.exit_code)


def run(command: Any, prog: str, argv: list[str] | None = None) -> NoReturn:
    """Run a click command as a program named ``prog`` and exit."""
    import click

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
