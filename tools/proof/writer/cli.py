"""``crucible-prove``: the thin click layer over :func:`crucible.proof.writer.prove`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from crucible import __version__
from crucible.core.cli import run
from crucible.core.errors import EXIT_OPERATIONAL, UsageError

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
@click.option("--out", type=_PATH, help="Bundle directory to write (replaced atomically).")
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
    out: Path | None,
    check_candidates: bool,
) -> int:
    """Apply an operation log and write a proof-bearing bundle (RFC 0024).

    Exit 0 written; 1 a forbidden operation or refused input (previous bundle
    untouched); 2 usage or unparsable input; 3 recording unavailable (the last
    complete prefix is written, labelled partial, with a custody folder).
    """
    if ctx.invoked_subcommand is not None:
        return 0
    missing = [
        name
        for name, value in (
            ("--workflow", workflow),
            ("--operations", operations),
            ("--artifacts", artifacts),
            ("--out", out),
        )
        if value is None
    ]
    if missing:
        raise UsageError(f"missing option {missing[0]} (see crucible-prove --help)")
    assert workflow and operations and artifacts and out
    if str(workflow) == str(operations) == "-":
        raise UsageError("--workflow and --operations cannot both read stdin (-)")
    for name, path in (("--workflow", workflow), ("--operations", operations)):
        # not is_file(): a pipe such as <(gzip -dc ops.ndjson.gz) is a fine input
        if str(path) != "-" and (not path.exists() or path.is_dir()):
            problem = "is a directory, not a file" if path.is_dir() else "no such file"
            raise UsageError(f"{name} {path}: {problem}")
    if not artifacts.is_dir():
        problem = "not a directory" if artifacts.exists() else "no such directory"
        raise UsageError(f"--artifacts {artifacts}: {problem}")
    from crucible.proof.writer import ProveOptions, prove

    result = prove(ProveOptions(workflow, operations, artifacts, out, check_candidates))
    click.echo(result.proof_digest)
    label = f" (partial: {result.partial})" if result.partial else ""
    click.echo(
        f"crucible-prove: {result.out}: {result.epochs} epochs, {result.bytes} bytes in "
        f"{result.files} files{label}",
        err=True,
    )
    if result.custody is not None:
        click.echo(f"crucible-prove: received material kept in custody: {result.custody}", err=True)
    if result.unrecordable:
        click.echo(
            f"crucible-prove: error: {result.unrecordable} (recording unavailable; "
            "the last complete prefix was written, labelled partial)",
            err=True,
        )
        return EXIT_OPERATIONAL
    return 0


@command.command("probe")
def probe_command() -> int:
    """Print the synthetic accounting experiment: measured candidates and boundaries."""
    from crucible.proof.writer._probe import run_probe

    sys.stdout.write(run_probe())
    return 0


def main() -> None:
    run(command, "crucible-prove")
