"""``crucible-verify BUNDLE [--expect FILE|DIGEST] [--json]``: click only, over
:func:`crucible.proof.reader.commands.run_verify`.

Exit 0 reading, 1 refusal or finding, 2 usage, 3 operational inability (no report).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from crucible import __version__
from crucible.core.cli import run

__all__ = ["command", "main"]

# readable=False: an unreadable bundle is an inability (3) and an unreadable --expect a
# usage error (2), each reported in the command's own one-line form, not click's
_PATH = click.Path(path_type=Path, readable=False)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bundle", type=_PATH)
@click.option(
    "--expect",
    "expect_path",
    type=_PATH,
    help="JSON file of independently held expectations (e.g. a pinned admissionProofDigest), "
    "or a digest sha256:<hex> that pins the workflowDigest.",
)
@click.option("--json", "as_json", is_flag=True, help="Write the report as JSON on stdout.")
@click.version_option(__version__, prog_name="crucible-verify")
def command(bundle: Path, expect_path: Path | None, as_json: bool) -> int:
    """Check a proof-bearing BUNDLE offline and report a reading or the first problem.

    Exit 0: a reading. 1: a refusal or finding. 2: usage. 3: no verdict reachable.
    """
    # lazy: proof.reader.commands is not loaded with this module; only command() needs it
    from crucible.proof.reader.commands import VerifyCommand, run_verify

    return run_verify(VerifyCommand(bundle, expect_path, as_json), sys.stdout.buffer, sys.stderr)


def main() -> None:
    run(command, "crucible-verify")
