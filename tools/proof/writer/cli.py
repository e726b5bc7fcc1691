"""``crucible-prove``: click only, over :func:`crucible.proof.writer.commands.run_prove`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from crucible import __version__
from crucible.core.cli import run

__all__ = ["command", "main"]

# readable=False: the commands report an unreadable file in their own one-line form
_PATH = click.Path(path_type=Path, readable=False)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="crucible-prove")
@click.option(
    "--workflow", type=_PATH, help="Workflow document (workflowVersion 2); - reads stdin."
)
@click.option("--operations", type=_PATH, help="Operation log (NDJSON); - reads stdin.")
@click.option("--artifacts", type=_PATH, help="Directory holding received artifact files.")
@click.option(
    "--state",
    type=_PATH,
    help="Export an accounted run: its state directory stands for --workflow, "
    "--operations and --artifacts; --out must be new or an empty directory.",
)
@click.option(
    "--out",
    type=_PATH,
    help="Bundle directory to write (replaced atomically; only a previous bundle or an "
    "empty directory is ever replaced).",
)
@click.option(
    "--check-candidates",
    is_flag=True,
    help="Also materialize every candidate in full and compare (slow; for audits).",
)
@click.pass_context
def command(
    ctx: click.Context,
    workflow: Path | None,
    operations: Path | None,
    artifacts: Path | None,
    state: Path | None,
    out: Path | None,
    check_candidates: bool,
) -> int:
    """Apply an operation log and write a proof-bearing bundle (RFC 0024).

    Exit 0 written; 1 a forbidden operation or refused input (previous bundle
    untouched; with --state also a state dir that is no run, an unaccounted run or a
    running one); 2 usage or unparsable input (with --state an --out that exists and
    is not an empty directory); 3 recording unavailable (the last complete prefix is
    written, labelled partial, with a custody folder).
    """
    if ctx.invoked_subcommand is not None:
        return 0
    # lazy: proof.writer.commands is not loaded with this module; only command() needs it
    from crucible.proof.writer.commands import ProveOptions, run_prove

    opts = ProveOptions(workflow, operations, artifacts, out, check_candidates, state)
    return run_prove(opts, sys.stdout.buffer, sys.stderr)


@command.command("probe")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one canonical JSON object (docs/schemas/prove-probe.json) instead of text.",
)
def probe_command(as_json: bool) -> int:
    """Print the synthetic accounting experiment: measured candidates and boundaries."""
    # lazy: proof.writer.commands is not loaded with this module; only probe_command() needs it
    from crucible.proof.writer.commands import ProbeOptions, run_probe

    return run_probe(ProbeOptions(json=as_json), sys.stdout.buffer, sys.stderr)


def main() -> None:
    run(command, "crucible-prove")
