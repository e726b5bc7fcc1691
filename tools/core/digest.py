"""SHA-256 digests in the one textual form every tool uses: ``sha256:<64 hex>``."""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from crucible.core import canon

__all__ = ["DIGEST_RE", "PREFIX", "is_digest", "of_bytes", "of_file", "of_json"]

PREFIX = "sha256:"
DIGEST_RE = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
_CHUNK = 1 << 20


def of_bytes(data: bytes) -> str:
    return PREFIX + hashlib.sha256(data).hexdigest()


def of_json(value: Any) -> str:
    """Digest of the canonical (RFC 8785) bytes of ``value``."""
    return of_bytes(canon.dumps(value))


def of_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return PREFIX + h.hexdigest()


def is_digest(text: object) -> bool:
    return isinstance(text, str) and DIGEST_RE.match(text) is not None
