"""A fan-out over a fan-out's outputs (docs/spec/run.md, "Fan-out over a fan-out").

``map = "a.v"`` (or a matrix axis ``"a.v"``) where ``a`` is itself mapped reads
``a``'s **fold**: one ``(instance key, value)`` per contributing instance, in
``a``'s item order. Which instances contribute is the need rule of a task: under
``join = "all"`` every one must have passed (else the fan-out is skipped), under
``join = "settled"`` the passed ones do. A map then has one instance per element of
each array value, keyed ``<a key>/<index>``, or one per instance whose value is not
an array, keyed ``<a key>``; the 100,000 bound is counted before anything is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crucible.compile import MAX_INSTANCES

__all__ = ["Fold", "FoldProblem", "FoldSkipped", "fold_pairs", "read_fold", "unique_keys"]


class FoldSkipped(Exception):
    """``join = "all"`` and an instance did not pass: the fan-out is skipped."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FoldProblem(Exception):
    """The fold cannot be expanded (the mapped task fails with this note)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Fold(list[tuple[str, Any]]):
    """A mapped producer's field: ``(instance key, value)`` per contributing
    instance, in item order."""


_DID = {"skipped": "was skipped", "failed": "failed"}


def read_fold(
    records: Mapping[str, Mapping[str, Any]],
    keys: Sequence[str],
    producer: str,
    field: str,
    *,
    settled: bool,
    what: str,
) -> Fold:
    """The fold of ``producer``'s ``field`` from its instance ``records`` (by key),
    ``keys`` in item order; ``settled``: the consumer's ``join = "settled"``."""
    out = Fold()
    for key in keys:
        record = records.get(key)
        status = str(record.get("status")) if record is not None else "not settled"
        if status != "passed":
            if settled:
                continue  # join = "settled": only passed instances contribute
            raise FoldSkipped(
                f"skipped: {what} reads instance {key!r} of {producer!r}, which "
                f"{_DID.get(status, 'did not settle')}"
                ' (join = "settled" lets the passed instances through)'
            )
        output = record.get("output") if record is not None else None
        if not isinstance(output, dict) or field not in output:
            raise FoldProblem(
                f"{what}: instance {key!r} of {producer!r} carries no field {field!r}"
            )
        out.append((key, output[field]))
    return out


def fold_pairs(fold: Fold, what: str) -> list[tuple[str, Any]]:
    """One instance per element of each array value (keyed ``<key>/<index>``), or
    per value that is not an array (keyed ``<key>``), in item order then element
    order; counted before they are built (the bound)."""
    total = sum(len(v) if isinstance(v, list) else 1 for _, v in fold)
    if total > MAX_INSTANCES:
        raise FoldProblem(
            f"{what} has {total:,} items over {len(fold):,} instances, more than {MAX_INSTANCES:,}"
        )
    pairs: list[tuple[str, Any]] = []
    for key, value in fold:
        if isinstance(value, list):
            pairs.extend((f"{key}/{i}", v) for i, v in enumerate(value))
        else:
            pairs.append((key, value))
    return pairs


def unique_keys(pairs: Sequence[tuple[str, Any]], what: str) -> None:
    """``<key>/<index>`` and a producer key that already holds a ``/`` can meet."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise FoldProblem(f"{what}: the instance key {key!r} comes twice")
        seen.add(key)
