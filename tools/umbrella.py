"""The git-style umbrella: ``crucible <tool> ARGS`` runs ``crucible-<tool> ARGS``.

Each tool is imported only when named, so ``crucible --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys

from crucible import __version__

# tool name -> (module, entry function); mirrors [project.scripts].
TOOLS: dict[str, tuple[str, str]] = {
    "compile": ("crucible.compile.cli", "compile_main"),
    "validate": ("crucible.compile.cli", "validate_main"),
    "stage": ("crucible.stage.cli", "main"),
    "dispatch": ("crucible.run.cli", "main"),
    "ledger": ("crucible.ledger.cli", "main"),
    "prove": ("crucible.proof.writer.cli", "main"),
    "verify": ("crucible.proof.reader.cli", "main"),
}

USAGE = """usage: crucible [--version] [--help] <tool> [ARGS...]

tools:
  compile    manifest (+ Starlark) -> plan IR (canonical JSON)
  validate   check a manifest, Starlark source or plan file
  stage      stage a task's inputs; capture its outputs; render agent prompts
  dispatch   run a plan end to end; report on a run
  ledger     durable, content-keyed steps (run -- CMD, get, put, ls, verify, compact)
  prove      write a proof-bearing bundle from an operation log
  verify     check a bundle offline

Each tool is also installed as crucible-<tool>; `crucible <tool> --help` for its options.
"""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = args[:1] == ["--debug"]
    if debug:  # `crucible --debug TOOL ...`: TOOL runs as with its own --debug
        args = args[1:]
    if len(args) >= 2 and args[0] == "help":  # `crucible help TOOL` = `crucible TOOL --help`
        args = [args[1], "--help"]
    if not args:
        # one line and the hint, as every tool's group says it (cli.md)
        sys.stderr.write("crucible: error: missing tool (see 'crucible --help')\n")
        raise SystemExit(2)
    if args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        raise SystemExit(0)
    if args[0] == "--version":
        sys.stdout.write(f"crucible {__version__}\n")
        raise SystemExit(0)
    name, rest = args[0], args[1:]
    if name not in TOOLS:
        sys.stderr.write(f"crucible: error: unknown tool {name!r}; known: {', '.join(TOOLS)}\n")
        raise SystemExit(2)
    module, func = TOOLS[name]
    if debug:
        # a flag for the edge, never an argument: appended to argv it would land
        # in a child's command line after `--` (`crucible ledger run -- CMD`)
        from crucible.core.cli import set_debug

        set_debug(True)
    sys.argv = [f"crucible-{name}", *rest]
    getattr(importlib.import_module(module), func)()
