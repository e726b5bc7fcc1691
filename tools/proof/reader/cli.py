"""``crucible-verify BUNDLE [--expect FILE] [--json]``: a thin click layer.

Exit 0 reading, 1 refusal or finding, 2 usage, 3 operational inability (no report).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from crucible import __version__
from crucible.core.cli import run
from crucible.core.errors import OperationalError, UsageError

__all__ = ["command", "main"]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option(
    "--expect",
    "expect_path",
    type=click.Path(path_type=Path),
    help="JSON file of independently held expectations (e.g. a pinned admissionProofDigest).",
)
@click.option("--json", "as_json", is_flag=True, help="Write the report as JSON on stdout.")
@click.version_option(__version__, prog_name="crucible-verify")
def command(bundle: Path, expect_path: Path | None, as_json: bool) -> int:
    """Check a proof-bearing BUNDLE offline and report a reading or the first problem.

    Exit 0: a reading. 1: a refusal or finding. 2: usage. 3: no verdict reachable.
    """
    from crucible.proof.reader.findings import Inability
    from crucible.proof.reader.verify import VerifyOptions, load_expectations, verify_bundle

    try:
        expect = load_expectations(expect_path) if expect_path is not None else None
    except ValueError as exc:
        raise UsageError(str(exc), where=str(expect_path)) from None
    try:
        report = verify_bundle(bundle, VerifyOptions(expect=expect))
    except Inability as exc:
        raise OperationalError(f"no verdict: {exc}", where=str(bundle)) from None
    if as_json:
        sys.stdout.buffer.write(report.to_bytes())
    else:
        click.echo(report.human())
    if report.problem is not None:
        click.echo(f"crucible-verify: {report.verdict}: {report.problem}", err=True)
    return report.exit_code


def main() -> None:
    run(command, "crucible-verify")
