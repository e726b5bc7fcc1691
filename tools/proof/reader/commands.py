"""What ``crucible-verify`` does, without click: options in, a report and an exit code out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO, TextIO

from crucible.core.structs import dataclass

__all__ = ["PROG", "VerifyCommand", "run_verify"]

PROG = "crucible-verify"

#: C0, DEL and C1 controls; a last guard so a message quoting bundle content stays one
#: line (names are escaped where they are read; this catches prose that quotes bytes)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class VerifyCommand:
    bundle: Path
    expect: Path | None = None
    as_json: bool = False


def _one_line(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def run_verify(opts: VerifyCommand, out: BinaryIO, err: TextIO) -> int:
    """Verify one bundle: the report on ``out`` (JSON or one line), a refusal or finding
    as one line on ``err``. Raises a CrucibleError for usage (2) and inability (3)."""
    # lazy: proof.reader is not loaded with this module; only run_verify() needs it
    from crucible.proof.reader import VerifyOptions, load_expectations, verify_bundle

    expect = load_expectations(opts.expect) if opts.expect is not None else None
    report = verify_bundle(opts.bundle, VerifyOptions(expect=expect))
    if opts.as_json:
        out.write(report.to_bytes())
    else:
        out.write(_one_line(report.human()).encode("utf-8") + b"\n")
    out.flush()
    if report.problem is not None:
        err.write(f"{PROG}: {report.verdict}: {_one_line(str(report.problem))}\n")
    return report.exit_code
