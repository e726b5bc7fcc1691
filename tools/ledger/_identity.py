"""Step identity: (scope, step), where the step embeds the full content key.

A content key is a JSON object; the step is ``<kind>:sha256:<hex>`` with the
SHA-256 taken over the key's canonical (RFC 8785) bytes. Canonical JSON is
injective on the values we accept, so two keys give the same step exactly when
they are the same value — no separator or escaping ambiguity can merge two keys.

For a command (``crucible-ledger run``) the key is::

    {"argv": [...], "keys": {NAME: VALUE, ...}, "files": {PATH: "sha256:<hex>", ...}}

``argv`` keeps its order; ``keys`` and ``files`` are objects, so the order in
which ``--key``/``--key-file`` options were given does not matter (our choice).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from crucible.core import canon, digest
from crucible.core.errors import UsageError
from crucible.core.structs import dataclass

__all__ = [
    "Identity",
    "command_key",
    "content_step",
    "parse_key_spec",
    "parse_key_specs",
    "read_key_files",
]

#: a key NAME: letters, digits and ``_ . : -``, not starting with ``-`` (our choice)
NAME_RE = re.compile(r"\A[A-Za-z0-9_.:][A-Za-z0-9_.:-]*\Z")
KIND_RE = re.compile(r"\A[a-z][a-z0-9_-]*\Z")


@dataclass(frozen=True)
class Identity:
    scope: str
    step: str


def content_step(kind: str, key: Any) -> str:
    """``<kind>:sha256:<hex>`` over the canonical bytes of ``key``."""
    if not KIND_RE.match(kind):
        raise UsageError(f"step kind {kind!r} must match [a-z][a-z0-9_-]*")
    return f"{kind}:{digest.of_json(key)}"


def _text(value: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid UTF-8") from None
    return value


def parse_key_spec(spec: str) -> tuple[str, str]:
    """``NAME=VALUE`` -> (NAME, VALUE); split at the first ``=``."""
    name, sep, value = spec.partition("=")
    if not sep:
        raise UsageError(f"--key {spec!r}: expected NAME=VALUE")
    if not NAME_RE.match(name):
        raise UsageError(
            f"--key {spec!r}: NAME must be letters, digits, '_', '.', ':' or '-' "
            "(not starting with '-')"
        )
    return name, _text(value, f"--key {name}")


def parse_key_specs(specs: Iterable[str]) -> dict[str, str]:
    keys: dict[str, str] = {}
    for spec in specs:
        name, value = parse_key_spec(spec)
        if name in keys and keys[name] != value:
            raise UsageError(f"--key {name} is given twice with different values")
        keys[name] = value
    return keys


def read_key_files(paths: Iterable[str]) -> dict[str, str]:
    """PATH (as given) -> ``sha256:<hex>`` of its bytes; an unreadable file is a
    usage error (exit 2), so nothing runs and nothing is recorded."""
    files: dict[str, str] = {}
    for path in paths:
        _text(path, "--key-file path")
        if path == "-":  # not stdin: a step's stdin belongs to its command
            raise UsageError(
                "--key-file -: stdin belongs to CMD and is never read as a key file;"
                " give a file (./- for a file named -)"
            )
        if not os.path.isfile(path):
            what = "does not exist" if not os.path.lexists(path) else "is not a regular file"
            raise UsageError(f"--key-file {path}: {what}")
        try:
            files[path] = digest.of_file(path)
        except OSError as exc:
            raise UsageError(f"--key-file {path}: cannot read: {exc.strerror}") from None
    return files


def command_key(
    argv: Sequence[str], keys: Mapping[str, str], files: Mapping[str, str]
) -> dict[str, Any]:
    """The content key of a command step (see the module docstring)."""
    if not argv:
        raise UsageError("no command given (put it after --)")
    for i, arg in enumerate(argv):
        _text(arg, f"command argument {i}")
    key = {"argv": list(argv), "keys": dict(keys), "files": dict(files)}
    canon.dumps(key)  # refuse anything outside the canonical domain here, not later
    return key
