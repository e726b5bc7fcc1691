"""crucible: small composable commands for DAG workflows."""

__version__ = "0.1.0"


def _interrupted_early(signum: int, frame: object) -> None:
    """Ctrl-C before the command edge is reached (while click and the tool load):
    one line and exit 130, as the edge itself would say (cli.md)."""
    # here, not at the top: the package's namespace holds its tools and __version__ only
    import contextlib
    import os
    import sys

    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "crucible"
    with contextlib.suppress(OSError):
        os.write(2, f"{prog}: interrupted\n".encode())
    os._exit(130)


def _terminated_early(signum: int, frame: object) -> None:
    """SIGTERM before the command edge is reached: one line and exit 143, as the
    edge says it (a default SIGTERM ended the process without a word)."""
    # here, not at the top: the package's namespace holds its tools and __version__ only
    import contextlib
    import os
    import sys

    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "crucible"
    with contextlib.suppress(OSError):
        os.write(2, f"{prog}: interrupted by SIGTERM\n".encode())
    os._exit(143)


def _guard_startup() -> None:
    # Only in a crucible program (its script imports this package first); a
    # library user or a test runner keeps its own SIGINT behaviour. Imported
    # here, not at the top: the package's namespace holds its tools and __version__.
    import contextlib
    import os
    import signal
    import sys

    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not prog.startswith("crucible"):
        return
    with contextlib.suppress(ValueError):  # not the main thread
        # A signal ignored by the parent (SIGINT in a background job) stays ignored.
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated_early)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupted_early)


_guard_startup()
