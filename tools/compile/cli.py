"""``crucible-compile`` and ``crucible-validate``: thin click layers.

Heavy modules (starlark, networkx) are imported only by the library functions
that need them, so ``--help`` starts fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from crucible import __version__

__all__ = ["compile_command", "compile_main", "validate_command", "validate_main"]


_CONTEXT = {"help_option_names": ["-h", "--help"]}  # as crucible-stage/-ledger/-prove


@click.command(
    name="crucible-compile",
    context_settings=_CONTEXT,
    help="Compile a pack manifest (TOML, optionally with a Starlark source) to a plan: "
    "canonical JSON on stdout, or in FILE with -o. PATH defaults to - (stdin).\n\n"
    "\b\n"
    "  crucible-compile pack.toml -o plan.json\n"
    "  crucible-compile pack.toml --graph mermaid\n\n"
    "Exit codes: 0 compiled; 1 the manifest is refused (diagnostics on stderr, "
    "unsupported edition); 2 usage, or a file that cannot be read or parsed; "
    "3 I/O failure.",
)
# readable=False, and directories allowed: the library reports both in the one-line
# `prog: error: FILE: ...` form with its documented exit code, not click's usage block
@click.argument(
    "path", type=click.Path(path_type=Path, allow_dash=True, readable=False), default="-"
)
@click.option(
    "-o",
    "--output",
    default="-",
    metavar="FILE",
    help="Write the plan to FILE atomically; an identical FILE is left untouched.",
)
@click.option(
    "--digest", "digest_only", is_flag=True, help="Print only the plan digest (sha256:…)."
)
@click.option(
    "--graph",
    type=click.Choice(["dot", "mermaid"]),
    default=None,
    help="Print the task DAG (Graphviz DOT or Mermaid) instead of the plan.",
)
@click.version_option(__version__, prog_name="crucible-compile")
def compile_command(path: Path, output: str, digest_only: bool, graph: str | None) -> None:
    # lazy: compile.commands is not loaded with this module; only compile_command() needs it
    from crucible.compile.commands import CompileOptions, run_compile

    if digest_only and graph:
        raise click.UsageError("--digest and --graph are exclusive")
    if not output:
        # Path("") is ".": it failed as "cannot write .: Device or resource busy" (exit 3)
        from crucible.core.errors import UsageError

        raise UsageError("-o needs a file name (or - for stdout)")
    code = run_compile(
        CompileOptions(path, output, digest_only, graph), sys.stdout.buffer, sys.stderr
    )
    click.get_current_context().exit(code)


@click.command(
    name="crucible-validate",
    context_settings=_CONTEXT,
    help="Check manifests (.toml), Starlark sources (.star) or plan files (anything else). "
    "Prints every problem (text on stderr; NDJSON on stdout with --json).\n\n"
    "\b\n"
    "  crucible-validate pack.toml plan.json\n"
    "  crucible-validate --json pack.toml | jq -r .code\n\n"
    "Exit codes (the highest over all PATHS): 0 no error; 1 any error; 2 usage, or a "
    "file that cannot be read or parsed; 3 I/O failure.",
)
@click.argument(
    "paths",
    nargs=-1,
    required=True,
    type=click.Path(path_type=Path, allow_dash=True, readable=False),
)
@click.option("--json", "as_json", is_flag=True, help="One NDJSON object per problem on stdout.")
@click.option(
    "--edition",
    type=click.IntRange(1, 3),
    default=None,
    help="Edition for a .star source with no manifest beside it that names it.",
)
@click.version_option(__version__, prog_name="crucible-validate")
def validate_command(paths: tuple[Path, ...], as_json: bool, edition: int | None) -> None:
    # lazy: compile.commands is not loaded with this module; only validate_command() needs it
    from crucible.compile.commands import ValidateOptions, run_validate

    code = run_validate(ValidateOptions(paths, as_json, edition), sys.stdout.buffer, sys.stderr)
    click.get_current_context().exit(code)


def compile_main() -> NoReturn:
    # lazy: core.cli is not loaded with this module; only compile_main() needs it
    from crucible.core.cli import run

    run(compile_command, "crucible-compile")


def validate_main() -> NoReturn:
    # lazy: core.cli is not loaded with this module; only validate_main() needs it
    from crucible.core.cli import run

    run(validate_command, "crucible-validate")
