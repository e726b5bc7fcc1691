"""Proof prefixes without quadratic work (RFC 0024 §2, §9).

With canonical key order the proof serializes as
``{"admissionProofVersion":1,"epochBlocks":[`` + blocks + ``],"execution":…}``:
a stable head, the flattened epochs packed by the full-block rule, and a
constant tail. :class:`PrefixHasher` keeps the SHA-256 state and the byte length
of the head plus the closed epochs; a prefix digest copies the state and feeds
the closing suffix, so each digest costs O(tail), not O(proof).
"""

from __future__ import annotations

import hashlib
from typing import Any

from crucible.core import canon
from crucible.proof import layout
from crucible.proof.reader._model import control_dumps

__all__ = ["PrefixHasher", "split_results"]

#: epochs passed phase 1: fixed ASCII member names, no floats, canonical as supplied,
#: so orjson with sorted keys reproduces their RFC 8785 bytes
_dumps = control_dumps

_HEAD = b'{"admissionProofVersion":1,"epochBlocks":['


class PrefixHasher:
    def __init__(self, root: dict[str, Any]) -> None:
        rest = {k: v for k, v in root.items() if k not in ("admissionProofVersion", "epochBlocks")}
        self.tail = b"]," + canon.dumps(rest)[1:]
        self._h = hashlib.sha256(_HEAD)
        self.length = len(_HEAD)
        self.closed = 0

    def separator(self) -> bytes:
        """What precedes the next epoch's bytes."""
        if self.closed == 0:
            return b"["
        return b"],[" if self.closed % layout.MAX_EPOCHS_PER_BLOCK == 0 else b","

    def digest(self) -> str:
        """Digest of P(closed) (P0 when no epoch is closed yet)."""
        h = self._h.copy()
        h.update(self.tail if self.closed == 0 else b"]" + self.tail)
        return "sha256:" + h.hexdigest()

    def open_size(self, epoch_bytes_len: int) -> int:
        """Size of a prefix holding the closed epochs plus one more epoch of that length."""
        return self.length + len(self.separator()) + epoch_bytes_len + 1 + len(self.tail)

    def close(self, epoch_bytes: bytes) -> None:
        sep = self.separator()
        self._h.update(sep)
        self._h.update(epoch_bytes)
        self.length += len(sep) + len(epoch_bytes)
        self.closed += 1


def split_results(epoch: dict[str, Any]) -> tuple[bytes, list[bytes], bytes]:
    """A group/retry epoch as (bytes before its first result, each result, bytes after).

    ``head + b",".join(results[:j]) + tail`` is the epoch's form in P(k, j).
    """
    before = b"{" + b",".join(
        _dumps(k) + b":" + _dumps(epoch[k]) for k in sorted(epoch) if k < "results"
    )
    head = before + (b"," if len(before) > 1 else b"") + b'"results":['
    after = b"".join(
        b"," + _dumps(k) + b":" + _dumps(epoch[k]) for k in sorted(epoch) if k > "results"
    )
    return head, [_dumps(r) for r in epoch["results"]], b"]" + after + b"}"
