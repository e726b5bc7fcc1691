"""A matrix's combinations (docs/spec/run.md, "Matrix"; GitHub Actions' rules), in
time linear in the combinations and the ``exclude``/``include`` entries.

The cartesian product of the axes in declaration order (the first axis varies
slowest); an ``exclude`` entry drops every combination that matches all the
axes it names; then each ``include`` entry adds its other keys to every
combination that matches it on all the axes it names (a later entry overwrites
an added key, never an axis value), and becomes a combination of its own when
it matches none. A matrix with no axes (only ``include``) has exactly its
include entries as combinations, in order (GitHub's include-only matrix).

Matching an entry against every combination is quadratic (100,000 combinations
and 1,000 excludes stalled a dispatcher's start-up). Instead the entries are
grouped by the axes they name (their *signature*): each signature is a set of
value tuples, and a combination is looked up once per signature — a matrix's
entries have few signatures (at most 2^axes). Values compare as JSON does
(``1`` is not ``true``): by their canonical texts.

The compiler uses :func:`matrix_size` to refuse a static matrix over the bound;
the dispatcher builds the combinations with :func:`matrix_combinations`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from crucible.core import canon

__all__ = ["TooManyCombinations", "matrix_combinations", "matrix_size"]

Axes = Sequence[tuple[str, Sequence[Any]]]


class TooManyCombinations(Exception):
    """The matrix has ``count`` combinations, more than the bound."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


class _Rules:
    """Entries grouped by signature: axis positions → {value texts → entry indices}."""

    def __init__(self, entries: Sequence[Mapping[str, Any]], position: Mapping[str, int]) -> None:
        self.groups: dict[tuple[int, ...], dict[tuple[bytes, ...], list[int]]] = {}
        for i, entry in enumerate(entries):
            named = sorted((position[k], canon.dumps(v)) for k, v in entry.items() if k in position)
            signature = tuple(a for a, _ in named)
            values = tuple(t for _, t in named)
            self.groups.setdefault(signature, {}).setdefault(values, []).append(i)

    def matching(self, combo_texts: Sequence[bytes]) -> Iterator[int]:
        """The indices of the entries this combination matches (by signature)."""
        for signature, table in self.groups.items():
            hit = table.get(tuple(combo_texts[a] for a in signature))
            if hit is not None:
                yield from hit

    def any(self, combo_texts: Sequence[bytes]) -> bool:
        return next(self.matching(combo_texts), None) is not None


def _walk(
    axes: Axes,
    exclude: Sequence[Mapping[str, Any]],
    include: Sequence[Mapping[str, Any]],
    limit: int,
) -> tuple[list[tuple[tuple[int, ...], list[int]]], list[int]]:
    """(kept combination as axis value indices, the include entries it matches in
    order) for each kept combination, and the include entries that matched none.
    Raises :class:`TooManyCombinations` past ``limit``."""
    if not axes:  # an include-only matrix: each entry is a combination, in order
        if len(include) > limit:
            raise TooManyCombinations(len(include))
        return [], list(range(len(include)))
    total = 1
    for _, values in axes:
        total *= len(values)
    if total > limit:  # before any work: the product alone is over
        raise TooManyCombinations(total)
    position = {name: i for i, (name, _) in enumerate(axes)}
    texts = [[canon.dumps(v) for v in values] for _, values in axes]
    excluded = _Rules(exclude, position)
    included = _Rules(include, position)
    kept: list[tuple[tuple[int, ...], list[int]]] = []
    matched: set[int] = set()
    for combo in itertools.product(*(range(len(v)) for _, v in axes)):
        combo_texts = [texts[a][i] for a, i in enumerate(combo)]
        if excluded.any(combo_texts):
            continue
        hits = sorted(included.matching(combo_texts))
        matched.update(hits)
        kept.append((combo, hits))
        if len(kept) > limit:
            raise TooManyCombinations(len(kept) + len(include) - len(matched))
    unmatched = [i for i in range(len(include)) if i not in matched]
    if len(kept) + len(unmatched) > limit:
        raise TooManyCombinations(len(kept) + len(unmatched))
    return kept, unmatched


def matrix_size(
    axes: Axes,
    exclude: Sequence[Mapping[str, Any]] = (),
    include: Sequence[Mapping[str, Any]] = (),
    *,
    limit: int,
) -> int:
    """How many combinations; :class:`TooManyCombinations` past ``limit``."""
    kept, unmatched = _walk(axes, exclude, include, limit)
    return len(kept) + len(unmatched)


def matrix_combinations(
    axes: Axes,
    exclude: Sequence[Mapping[str, Any]] = (),
    include: Sequence[Mapping[str, Any]] = (),
    *,
    limit: int,
) -> list[dict[str, Any]]:
    """The combinations, in order (module doc)."""
    kept, unmatched = _walk(axes, exclude, include, limit)
    names = [name for name, _ in axes]
    extras = [{k: v for k, v in entry.items() if k not in names} for entry in include]
    out: list[dict[str, Any]] = []
    for combo, hits in kept:
        combination = {names[a]: axes[a][1][i] for a, i in enumerate(combo)}
        for i in hits:
            combination.update(extras[i])
        out.append(combination)
    out.extend(dict(include[i]) for i in unmatched)
    return out
