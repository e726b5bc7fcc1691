"""The proof read epoch by epoch: bounded memory for large proofs (RFC 0024 §9).

A canonical proof is ``{"admissionProofVersion":1,"epochBlocks":[[e1,…],…],…}``.
Instead of materializing every epoch as Python objects (about five times the
proof's bytes), the reader scans the blocks once, checks each epoch's bounds and
canonical bytes as it goes, and keeps only the proof bytes and each epoch's byte
span. Every later phase iterates the epochs again, parsing one at a time.

A proof that does not have the canonical shape is parsed whole instead, which
is bounded by the proof ceiling and yields the precise phase-1 refusal.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterator
from typing import Any

import orjson

from crucible.core import canon
from crucible.proof import layout
from crucible.proof.reader._findings import over_bound
from crucible.proof.reader._strict import JsonBounds, check_bounds, parse_json

__all__ = ["Proof", "load_proof"]

_HEAD = b'{"admissionProofVersion":'
_BLOCKS = b',"epochBlocks":['


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


class Proof:
    """The root members (without ``epochBlocks``), block sizes, and epochs by span."""

    def __init__(self, data: bytes, root: Any, blocks: list[int] | None, spans: array[int]) -> None:
        self.data = data
        self.root = root
        self.blocks = blocks
        self._spans = spans

    def __len__(self) -> int:
        return len(self._spans) // 2

    def __iter__(self) -> Iterator[dict[str, Any]]:
        view = memoryview(self.data)
        spans = self._spans
        for i in range(0, len(spans), 2):
            epoch: dict[str, Any] = orjson.loads(view[spans[i] : spans[i + 1]])
            yield epoch

    def epoch_bytes(self) -> Iterator[bytes]:
        spans = self._spans
        for i in range(0, len(spans), 2):
            yield self.data[spans[i] : spans[i + 1]]

    def last(self) -> dict[str, Any]:
        spans = self._spans
        value: dict[str, Any] = orjson.loads(self.data[spans[-2] : spans[-1]])
        return value


def _whole(data: bytes, path: str, bounds: JsonBounds) -> Proof:
    value = parse_json(data, path, bounds, canonical=True)
    if type(value) is not dict:
        return Proof(data, value, None, array("q"))
    root = {k: v for k, v in value.items() if k != "epochBlocks"}
    blocks = value.get("epochBlocks")
    if type(blocks) is not list or any(type(b) is not list for b in blocks):
        return Proof(data, root, None, array("q"))
    # canonical: each epoch's span follows from its canonical length
    spans = array("q")
    pos = data.index(b'"epochBlocks":[') + len(b'"epochBlocks":[')
    for b in blocks:
        pos += 1  # "["
        for i, e in enumerate(b):
            n = len(canon.dumps(e))
            spans.extend((pos, pos + n))
            pos += n + (1 if i < len(b) - 1 else 0)
        pos += 2  # "]," or "]]"
    return Proof(data, root, [len(b) for b in blocks], spans)


def load_proof(data: bytes, path: str, bounds: JsonBounds) -> Proof:
    """Scan the proof; raise a phase-1 :class:`Problem` in the order of strict.parse_json."""
    if not data.startswith(_HEAD):
        return _whole(data, path, bounds)
    at = data.find(_BLOCKS)
    if at < 0 or not data[len(_HEAD) : at].isdigit():
        return _whole(data, path, bounds)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _whole(data, path, bounds)
    if len(text) != len(data):  # non-ASCII: byte and character offsets differ
        return _whole(data, path, bounds)
    pos = at + len(_BLOCKS)
    spans = array("q")
    blocks: list[int] = []
    if text[pos : pos + 1] == "]":
        pos += 1
    else:
        while True:
            if text[pos : pos + 1] != "[":
                return _whole(data, path, bounds)
            pos += 1
            count = 0
            while True:
                try:
                    epoch, end = _DECODER.raw_decode(text, pos)
                except (json.JSONDecodeError, ValueError, RecursionError):
                    return _whole(data, path, bounds)
                count += 1
                if count > layout.MAX_EPOCHS_PER_BLOCK:
                    raise over_bound(f"a block of more than {count - 1} epochs", path)
                check_bounds(epoch, path, bounds, depth=4)
                try:
                    if canon.dumps(epoch) != data[pos:end]:
                        return _whole(data, path, bounds)
                except canon.CanonError:
                    return _whole(data, path, bounds)
                spans.extend((pos, end))
                pos = end
                sep, pos = text[pos : pos + 1], pos + 1
                if sep == "]":
                    break
                if sep != ",":
                    return _whole(data, path, bounds)
            blocks.append(count)
            if len(blocks) > layout.MAX_BLOCKS:
                raise over_bound(f"more than {layout.MAX_BLOCKS} epoch blocks", path)
            sep, pos = text[pos : pos + 1], pos + 1
            if sep == "]":
                break
            if sep != ",":
                return _whole(data, path, bounds)
    # the remaining root members: the head plus the tail close one canonical object
    tail = data[pos:]
    if tail[:1] not in (b",", b"}"):
        return _whole(data, path, bounds)
    try:
        root = orjson.loads(data[:at] + (b"}" if tail == b"}" else b"," + tail[1:]))
    except orjson.JSONDecodeError:
        return _whole(data, path, bounds)
    if type(root) is not dict or "epochBlocks" in root:
        return _whole(data, path, bounds)
    check_bounds(root, path, bounds, depth=1)
    try:
        if canon.dumps(root)[at:] != tail:
            return _whole(data, path, bounds)
    except canon.CanonError:
        return _whole(data, path, bounds)
    return Proof(data, root, blocks, spans)
