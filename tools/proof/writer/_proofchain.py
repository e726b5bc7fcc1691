"""The admission proof as a hash chain built in linear time (RFC 0024 §2, §9).

The canonical proof serializes as ``{"admissionProofVersion":1,"epochBlocks":[[e1,…``
followed by a tail that depends only on the root. Closed epochs never change, so
the SHA-256 state over that prefix is kept and copied; a prefix's digest costs the
bytes of the open epoch and the closing tail, never a re-serialization. Inside an
open group or retry epoch ``results`` sorts before ``starts``, so an observation is
appended in place too. Sizes are kept the same way. The bytes are spooled to a file
so the final proof is written without holding it in memory.
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

import orjson

from crucible.core import canon, digest
from crucible.proof import layout

__all__ = ["ProofChain", "split_at_results"]

_HEAD = b'{"admissionProofVersion":1,"epochBlocks":['
_RESULTS_KEY = "results"


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def split_at_results(epoch: dict[str, Any]) -> tuple[bytes, bytes]:
    """Canonical bytes of ``epoch`` (whose ``results`` is ignored) split around the
    results array's elements: ``head + b",".join(results) + tail`` is canonical."""
    keys = sorted(epoch)  # every key is ASCII: code-point order is RFC 8785 order
    # epochs are writer-built control values: orjson's sorted output is JCS here
    # (see crucible.proof.writer._state.control_dumps)
    before = [_dumps(k) + b":" + _dumps(epoch[k]) for k in keys if k < _RESULTS_KEY]
    after = [_dumps(k) + b":" + _dumps(epoch[k]) for k in keys if k > _RESULTS_KEY]
    head = b"{" + b",".join(before) + (b"," if before else b"") + b'"results":['
    tail = b"]" + b"".join(b"," + a for a in after) + b"}"
    return head, tail


def _separator(number: int) -> bytes:
    """Bytes written before epoch ``number`` under the full-block rule."""
    if number == 1:
        return b"["
    if (number - 1) % layout.MAX_EPOCHS_PER_BLOCK == 0:
        return b"],["
    return b","


class _Open:
    __slots__ = ("hasher", "head", "n_results", "number", "results_len", "tail")

    def __init__(self, number: int, head: bytes, tail: bytes, hasher: Any) -> None:
        self.number = number
        self.head = head
        self.tail = tail
        self.hasher = hasher
        self.results_len = 0
        self.n_results = 0


class ProofChain:
    """The proof root plus its epochs, with O(new bytes) size and digest queries."""

    def __init__(self, root: dict[str, Any], spool: IO[bytes] | None = None) -> None:
        empty = canon.dumps({**root, "admissionProofVersion": 1, "epochBlocks": []})
        assert empty.startswith(_HEAD + b"]"), "root members must sort after epochBlocks"
        self._tail_root = empty[len(_HEAD) + 1 :]
        self._closed = hashlib.sha256(_HEAD)
        self._closed_len = len(_HEAD)
        self._spool = spool
        if spool is not None:
            spool.write(_HEAD)
        self.closed_epochs = 0
        self._open: _Open | None = None
        self.p0_digest = digest.of_bytes(empty)

    # -- queries --------------------------------------------------------------------
    @property
    def epochs(self) -> int:
        """Epochs in the current prefix, the open one included."""
        return self.closed_epochs + (1 if self._open else 0)

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def _closing(self, n_epochs: int) -> bytes:
        return (b"]]" if n_epochs else b"]") + self._tail_root

    def size(self) -> int:
        """Byte length of the current prefix (P(k) or P(k,j))."""
        o = self._open
        if o is None:
            return self._closed_len + len(self._closing(self.closed_epochs))
        return (
            self._closed_len
            + len(_separator(o.number))
            + len(o.head)
            + o.results_len
            + max(0, o.n_results - 1)
            + len(o.tail)
            + len(self._closing(o.number))
        )

    def size_with_closed(self, epoch_bytes: bytes) -> int:
        """Length of the prefix after appending one closed epoch (no open epoch)."""
        n = self.closed_epochs + 1
        return self._closed_len + len(_separator(n)) + len(epoch_bytes) + len(self._closing(n))

    def size_with_open(self, head: bytes, tail: bytes) -> int:
        """Length of P(k,0) for a new group/retry epoch with these parts."""
        n = self.closed_epochs + 1
        return self._closed_len + len(_separator(n)) + len(head) + len(tail) + len(self._closing(n))

    def size_with_result(self, result_bytes: bytes) -> int:
        """Length of P(k,j+1) after appending one observation to the open epoch."""
        o = self._open
        assert o is not None
        return self.size() + len(result_bytes) + (1 if o.n_results else 0)

    def digest(self) -> str:
        """Digest of the current prefix."""
        o = self._open
        if o is None:
            h = self._closed.copy()
            h.update(self._closing(self.closed_epochs))
        else:
            h = o.hasher.copy()
            h.update(o.tail + self._closing(o.number))
        return digest.PREFIX + h.hexdigest()

    def previous_digest(self) -> str:
        """previousProofDigest for the next epoch: digest of the closed prefix (or P0)."""
        assert self._open is None, "an open epoch admits no following epoch"
        return self.digest() if self.closed_epochs else self.p0_digest

    # -- changes --------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self._spool is not None:
            self._spool.write(data)

    def append_closed(self, epoch_bytes: bytes) -> None:
        assert self._open is None
        n = self.closed_epochs + 1
        chunk = _separator(n) + epoch_bytes
        self._closed.update(chunk)
        self._closed_len += len(chunk)
        self._write(chunk)
        self.closed_epochs = n

    def open(self, head: bytes, tail: bytes) -> None:
        assert self._open is None
        n = self.closed_epochs + 1
        chunk = _separator(n) + head
        hasher = self._closed.copy()
        hasher.update(chunk)
        self._write(chunk)
        self._open = _Open(n, head, tail, hasher)

    def add_result(self, result_bytes: bytes) -> None:
        o = self._open
        assert o is not None
        chunk = (b"," if o.n_results else b"") + result_bytes
        o.hasher.update(chunk)
        o.results_len += len(result_bytes)
        o.n_results += 1
        self._write(chunk)

    def close(self) -> None:
        o = self._open
        assert o is not None
        o.hasher.update(o.tail)
        self._closed = o.hasher
        self._closed_len += len(_separator(o.number)) + len(o.head) + o.results_len
        self._closed_len += max(0, o.n_results - 1) + len(o.tail)
        self._write(o.tail)
        self.closed_epochs = o.number
        self._open = None

    def finishing_bytes(self) -> bytes:
        """What follows the spooled bytes to complete the current prefix."""
        o = self._open
        if o is None:
            return self._closing(self.closed_epochs)
        return o.tail + self._closing(o.number)
