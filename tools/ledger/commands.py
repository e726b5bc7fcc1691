"""The library side of each ``crucible-ledger`` subcommand. No click here: the
CLI builds one options dataclass and calls ``run_<verb>(options, out, err)``,
which writes data to ``out`` (bytes) and messages to ``err`` (text) and
returns the exit code: the shape of every crucible command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO

from crucible.core import canon
from crucible.core.errors import OperationalError, UsageError
from crucible.core.output import write_stream
from crucible.core.structs import dataclass
from crucible.ledger._identity import command_key, content_step, parse_key_specs, read_key_files
from crucible.ledger._ledger import Ledger, Outcome, Reply, Warn, stderr_warn
from crucible.ledger._maintenance import compact, verify
from crucible.ledger._runner import (
    CommandResult,
    command_outcome,
    decode_streams,
    run_command,
)

__all__ = [
    "CompactOptions",
    "GetOptions",
    "KeySpec",
    "LsOptions",
    "PutOptions",
    "StepRunOptions",
    "VerifyOptions",
    "created_dir",
    "existing_dir",
    "resolve_step",
    "run_compact",
    "run_get",
    "run_ls",
    "run_put",
    "run_run",
    "run_verify",
]

PROG = "crucible-ledger"


def existing_dir(directory: str) -> Path:
    """``--dir`` for reading: a missing directory is an empty ledger (nothing is
    created); something that is not a directory is a usage error (exit 2)."""
    path = Path(directory)
    if os.path.lexists(path) and not path.is_dir():
        raise UsageError(f"--dir {directory}: not a directory")
    return path


def created_dir(directory: str) -> Path | str:
    """``--dir`` for writing, created with its parents when missing (as ccache
    does); the reason as a string when it cannot be had."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = "not a directory" if isinstance(exc, FileExistsError) else exc.strerror
        return f"cannot create the ledger directory {directory} ({reason or exc})"
    return path


def _scope(scope: str) -> str:
    if not scope:
        raise UsageError("--scope must not be empty")
    try:
        scope.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("--scope is not valid UTF-8") from None
    return scope


@dataclass(frozen=True)
class KeySpec:
    """How a step is named on the command line: ``--step`` verbatim, or derived
    from ``--key``, ``--key-file`` and the command after ``--``."""

    step: str | None = None
    keys: tuple[str, ...] = ()
    key_files: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()


def resolve_step(spec: KeySpec) -> tuple[str, dict[str, Any] | None]:
    """(step, content key or None)."""
    if spec.step is not None:
        if spec.keys or spec.key_files or spec.argv:
            raise UsageError("give either --step or --key/--key-file/-- CMD, not both")
        if not spec.step:
            raise UsageError("--step must not be empty")
        try:
            spec.step.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("--step is not valid UTF-8") from None
        return spec.step, None
    key = command_key(spec.argv, parse_key_specs(spec.keys), read_key_files(spec.key_files))
    return content_step("run", key), key


@dataclass(frozen=True)
class StepRunOptions:
    """``crucible-ledger run``: a command run as a recorded step (not the dispatcher's
    :class:`crucible.run.RunOptions`)."""

    directory: str
    scope: str
    keys: tuple[str, ...]
    key_files: tuple[str, ...]
    record_exits: tuple[int, ...]
    argv: tuple[str, ...]


def run_run(
    options: StepRunOptions, out: BinaryIO, err: TextIO, *, warn: Warn = stderr_warn
) -> int:
    """Replay a recorded command, or run it (live output) and record it if settled.
    Returns the command's status (or the replayed one). The command's own
    output goes to ``out`` and to ``err``'s byte stream, as it came."""
    err.flush()  # what was written as text goes before the command's bytes
    stdout, stderr = out, err.buffer
    scope = _scope(options.scope)
    for code in options.record_exits:
        if not 1 <= code <= 255:
            raise UsageError(f"--record-exit {code}: must be an exit code from 1 to 255")
    if not options.argv:
        raise UsageError("no command given: crucible-ledger run ... -- CMD ARGS")
    step, key = resolve_step(KeySpec(None, options.keys, options.key_files, options.argv))
    directory = created_dir(options.directory)
    if isinstance(directory, str):
        # ADR 0025: a ledger that cannot be had degrades to "execute the work"
        warn(f"{directory}; running {options.argv[0]} unrecorded")
        return _execute(options, stdout=stdout, stderr=stderr)[0].shell_status
    with Ledger(directory, warn=warn) as ledger:
        hit = ledger.lookup(scope, step)
        replay = _replayable(hit, options.record_exits, err=err, warn=warn)
        if hit is not None and replay is not None:
            code, replayed_out, replayed_err = replay
            _write(stdout, replayed_out)
            _write(stderr, replayed_err, name="<stderr>")
            stderr.flush()
            err.write(
                f"{PROG}: cached: replayed {options.argv[0]} (exit {code}, "
                f"recorded {hit.at}; step {hit.step})\n"
            )
            err.flush()
            return code
        result, outcome = _execute(options, stdout=stdout, stderr=stderr, check_output=False)
        if outcome.settled:
            ledger.record(scope, step, outcome, key=key)
        elif result.overflow:
            warn(f"output larger than the capture limit; {step} not recorded")
        elif result.interrupted_by is not None:
            warn(f"interrupted by signal {result.interrupted_by}; not recorded")
        elif result.signal is not None:
            warn(f"{options.argv[0]} was killed by signal {result.signal}; not recorded")
    _check_output(result)
    return result.shell_status


def _execute(
    options: StepRunOptions, *, stdout: IO[bytes], stderr: IO[bytes], check_output: bool = True
) -> tuple[CommandResult, Outcome]:
    # CannotStart is in the error tree (exit 2 or 3): it reaches the edge as it is
    result = run_command(options.argv, stdout=stdout, stderr=stderr)
    if check_output:
        _check_output(result)
    return result, command_outcome(result, set(options.record_exits))


def _check_output(result: CommandResult) -> None:
    """Exit 3 when the live copy of the output failed (a full disk under ``> f``):
    exit 0 over a truncated file would be a lie. The result, a fact, stays
    recorded; what failed is our copy of it. Our own interruption wins."""
    if result.output_error is not None and result.interrupted_by is None:
        raise OperationalError(result.output_error)


def _replayable(
    hit: Reply | None, record_exits: tuple[int, ...], *, err: TextIO, warn: Warn
) -> tuple[int, bytes, bytes] | None:
    """(exit, stdout, stderr) to replay, or None to run the command."""
    if hit is None:
        return None
    replay = decode_streams(hit.value)
    if replay is None:
        warn(f"the record of {hit.step} is not a command result; running the command")
        return None
    if replay[0] != 0 and replay[0] not in record_exits:
        # a recorded failure replays only while the caller still calls it deterministic
        err.write(
            f"{PROG}: recorded exit {replay[0]} is not a --record-exit code here; running again\n"
        )
        err.flush()
        return None
    return replay


def _write(stream: IO[bytes], data: bytes, *, name: str = "<stdout>") -> None:
    """All of ``data`` or an OperationalError (exit 3): never a silently short write."""
    write_stream(stream, data, name=name)


@dataclass(frozen=True)
class GetOptions:
    """``crucible-ledger get``: the step whose record is printed."""

    directory: str
    scope: str
    spec: KeySpec


def run_get(opts: GetOptions, out: BinaryIO, err: TextIO) -> int:
    """Print the recorded reply (with ``"cached": true``); exit 1 on a miss."""
    path = existing_dir(opts.directory)
    scope = _scope(opts.scope)
    step, _ = resolve_step(opts.spec)
    with Ledger(path, readonly=True) as ledger:
        hit = ledger.lookup(scope, step)
    if hit is None:
        err.write(f"{PROG}: no record of step {step} in scope {scope}\n")
        return 1
    _write(out, canon.dumps(hit.to_json()) + b"\n")
    return 0


@dataclass(frozen=True)
class PutOptions:
    """``crucible-ledger put``: the step, and where its JSON value is read from."""

    directory: str
    scope: str
    spec: KeySpec
    #: a deterministic failure, not a success
    failed: bool
    stdin: IO[bytes]


def run_put(opts: PutOptions, out: BinaryIO, err: TextIO) -> int:
    """Record the JSON value read from ``opts.stdin`` as a settled fact."""
    directory = opts.directory
    existing_dir(directory)  # a file in its place is a usage error, as for the readers
    scope = _scope(opts.scope)
    step, key = resolve_step(opts.spec)
    raw = opts.stdin.read()
    try:
        value = canon.loads(raw)
    except canon.CanonError as exc:
        raise canon.CanonError(exc.message, where="<stdin>") from None
    created = created_dir(directory)
    if isinstance(created, str):
        raise OperationalError(f"{created}; nothing recorded")
    path = created
    problems: list[str] = []
    with Ledger(path, warn=problems.append) as ledger:
        outcome = Outcome.failed(value) if opts.failed else Outcome.ok(value)
        recorded = ledger.record(scope, step, outcome, key=key)
    for problem in problems[:-1] if not recorded else problems:
        stderr_warn(problem)
    if not recorded:
        raise OperationalError(problems[-1] if problems else "not recorded")
    _write(out, canon.dumps({"scope": scope, "step": step}) + b"\n")
    return 0


@dataclass(frozen=True)
class LsOptions:
    """``crucible-ledger ls``: the ledger, and only one scope's records if given."""

    directory: str
    scope: str | None = None


def run_ls(opts: LsOptions, out: BinaryIO, err: TextIO) -> int:
    """The latest record of each identity as NDJSON, in file order."""
    path = existing_dir(opts.directory)
    scope = opts.scope
    if scope is not None:
        scope = _scope(scope)  # as get/put/run: an empty scope is a usage error
    with Ledger(path, readonly=True) as ledger:
        batch: list[bytes] = []
        size = 0
        for payload in ledger.records(scope):
            batch.append(payload + b"\n")
            size += len(payload) + 1
            if size >= 1 << 20:  # one write per MiB, not per record
                _write(out, b"".join(batch))
                batch, size = [], 0
        _write(out, b"".join(batch))
    return 0


@dataclass(frozen=True)
class VerifyOptions:
    """``crucible-ledger verify``: the ledger to check."""

    directory: str


def run_verify(opts: VerifyOptions, out: BinaryIO, err: TextIO) -> int:
    """The ledger's health as JSON on ``out``, a summary on ``err``; exit 1 on damage."""
    report = verify(existing_dir(opts.directory))
    _write(out, canon.dumps(report) + b"\n")
    summary = (
        f"{report['path']}: {report['records']} records, {report['identities']} identities, "
        f"{report['duplicates']} duplicates, {report['bad_lines']} bad lines"
        + (", torn tail" if report["torn_tail"] else "")
    )
    for bad in report["bad"][:10]:
        err.write(f"{PROG}: {report['path']}:{bad['line']}: {bad['reason']}\n")
    err.write(f"{PROG}: {summary}: {'DAMAGED' if report['damaged'] else 'ok'}\n")
    return 1 if report["damaged"] else 0


@dataclass(frozen=True)
class CompactOptions:
    """``crucible-ledger compact``: the ledger to rewrite."""

    directory: str


def run_compact(opts: CompactOptions, out: BinaryIO, err: TextIO) -> int:
    """Keep the latest record per identity; the counts on ``out`` and ``err``."""
    report = compact(existing_dir(opts.directory))
    _write(out, canon.dumps(report.to_json()) + b"\n")
    message = (
        f"{PROG}: compacted {report.path}: kept {report.kept} of {report.records_before} "
        f"records, dropped {report.dropped_duplicates} duplicates"
    )
    if report.rejected is not None:
        message += (
            f"; {report.dropped_bad} bad line(s)"
            + (" and a torn tail" if report.torn_tail else "")
            + f" moved to {report.rejected.name}"
        )
    err.write(message + "\n")
    return 0
