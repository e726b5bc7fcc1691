"""A task's declared ``reads``: the files they match, their digests, and the
``reads`` component of its cache key (docs/spec/cache.md, "Declared reads").

A relative entry is a glob under the pack directory (``*``, ``?``, ``[...]``
within a segment, ``**`` any number of segments: crucible.core.globs); an
absolute entry is a path or glob on the host. An entry naming a directory
(no glob characters) stands for every file beneath it. Only regular files
match (a symlink to one counts, under its own name); directories are walked
without following symlinks, so a link loop cannot hang the keying.

Each file is hashed once: the **stat memo** (``DIR/reads-memo.json``) maps
its absolute path to ``[dev, ino, size, mtime_ns, ctime_ns, digest]``; a
file whose stat still says the same is not read again. ``ctime`` changes with
any write or rename over the file, so an edit that restores the mtime still
misses. The listing behind each ``reads`` digest is kept content-addressed
(``DIR/reads/<2 hex>/<62 hex>.json``) so a miss can name the file that
changed.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from crucible.core import canon, digest
from crucible.core.globs import GLOB_CHARS, pattern_regex

__all__ = ["Listing", "ReadsKeyer", "describe_change", "match_files", "split_entry"]

#: one entry's matches: (path as keyed, absolute path), sorted by the first
Matches = list[tuple[str, str]]
#: per entry: [pattern, [[path, digest], ...]]; what the component digests
Listing = list[list[Any]]

_MEMO = "reads-memo.json"


def split_entry(entry: str, pack_dir: str) -> tuple[str, tuple[str, ...], bool]:
    """(base directory to walk, glob segments below it, absolute entry)."""
    absolute = entry.startswith("/")
    root = "/" if absolute else pack_dir
    parts = [p for p in entry.split("/") if p not in ("", ".")]
    fixed: list[str] = []
    for i, part in enumerate(parts):
        if GLOB_CHARS & set(part):
            return os.path.normpath(os.path.join(root, *fixed)), tuple(parts[i:]), absolute
        fixed.append(part)
    return os.path.normpath(os.path.join(root, *fixed)), (), absolute


def _walk(base: str) -> Iterator[tuple[str, str]]:
    """(path relative to ``base``, absolute path) of every file beneath it."""
    stack = [("", base)]
    while stack:
        rel, where = stack.pop()
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        for e in entries:
            name = f"{rel}/{e.name}" if rel else e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append((name, e.path))
                elif e.is_file(follow_symlinks=True):
                    yield name, e.path
            except OSError:
                continue


def _printable(path: str) -> str:
    """A path as keyed: a name that is not UTF-8 (held by Python as lone
    surrogates, which no JSON can carry) keyed with its bytes escaped."""
    if path.isascii():
        return path
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")
    return path


def match_files(entry: str, pack_dir: str) -> Matches:
    """The files ``entry`` matches, sorted: (path as keyed: relative to the pack
    directory, or absolute for an absolute entry; absolute path)."""
    base, globs, absolute = split_entry(entry, pack_dir)
    # the keyed spelling of what lies under ``base``: one prefix, not a relpath a file
    if absolute:
        prefix = base.rstrip("/") + "/"
    else:
        under = os.path.relpath(base, pack_dir)
        prefix = "" if under == "." else under + "/"
    out: Matches = []
    if not globs:
        try:
            st = os.stat(base)
        except OSError:
            return out
        if stat_mod.S_ISREG(st.st_mode):
            out.append((base if absolute else prefix.rstrip("/"), base))
        elif stat_mod.S_ISDIR(st.st_mode):
            out.extend((prefix + rel, full) for rel, full in _walk(base))
    else:
        match = pattern_regex(globs).match
        out.extend((prefix + rel, full) for rel, full in _walk(base) if match(rel))
    if not all(keyed.isascii() for keyed, _ in out):
        out = [(_printable(keyed), full) for keyed, full in out]
    out.sort()
    return out


def _listing_bytes(listing: Listing) -> bytes:
    """The canonical JSON of a listing: arrays of UTF-8 strings only (entries
    from the plan, paths made printable), for which orjson writes the RFC 8785
    bytes (crucible.core.canon's own fast path) without canon's walk over
    10,000 members first."""

    return orjson.dumps(listing)


class ReadsKeyer:
    """Lists and hashes declared reads for one process (a run's keyer): each
    distinct ``reads`` list is listed once per run, each file hashed once per
    stat (the memo)."""

    #: how long a file must have been unchanged before its digest is memoized
    RACY_NS = 2_000_000_000

    def __init__(self, pack_dir: str, cache_dir: Path | None) -> None:
        self.pack_dir = pack_dir or os.getcwd()
        self.cache_dir = cache_dir
        self._memo: dict[str, list[Any]] | None = None
        self._memo_dirty = False
        self._components: dict[tuple[str, ...], str] = {}
        self._listings: dict[str, Listing] = {}

    # ---------------------------------------------------------------- memo

    def _load_memo(self) -> dict[str, list[Any]]:
        if self._memo is None:
            self._memo = {}
            if self.cache_dir is not None:
                # lazy: core.fdio is not loaded with this module; only _load_memo() needs it
                from crucible.core.fdio import read_regular

                with contextlib.suppress(Exception):  # a damaged memo only costs rereads
                    loaded = orjson.loads(read_regular(self.cache_dir / _MEMO, follow=False))
                    if isinstance(loaded, dict):
                        self._memo = loaded
        return self._memo

    def _save_memo(self) -> None:
        if not self._memo_dirty or self.cache_dir is None or self._memo is None:
            return
        self._memo_dirty = False

        # lazy: core.atomic is not loaded with this module; only _save_memo() needs it
        from crucible.core import atomic

        # TypeError: a path that is not UTF-8 cannot be a JSON key (its file is
        # hashed again next run, nothing worse)
        with contextlib.suppress(OSError, TypeError):
            atomic.write_bytes(self.cache_dir / _MEMO, orjson.dumps(self._memo), durable=False)

    def file_digest(self, path: str) -> str:
        """``sha256:`` of the file's bytes, from the memo while its stat holds."""
        memo = self._load_memo()
        st = os.stat(path)
        ident = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        known = memo.get(path)
        if known is not None and known[:5] == ident:
            return str(known[5])
        # lazy: run.cache._storefs is not loaded with this module; only file_digest() needs it
        from crucible.run.cache import _storefs

        # a declared read may be a link to a file: its target's bytes are keyed
        # (the store's reader refuses links, on purpose: it reads the store)
        found = _storefs.file_digest(os.path.realpath(path))
        # A file changed within the last RACY_NS may change again within the
        # same timestamp tick, same size, after it was read, and its stat would
        # not show it (git's "racily clean" entries): such a digest is not kept,
        # the file is read again next run, until it has been still a while.
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= self.RACY_NS:
            memo[path] = [*ident, found]
            self._memo_dirty = True
        return found

    # ----------------------------------------------------------- component

    def listing(self, reads: Sequence[str]) -> Listing:
        memo = self._load_memo()
        stat = os.stat
        out: Listing = []
        for entry in reads:
            files = []
            for keyed, full in match_files(entry, self.pack_dir):
                # the memo's test inlined: a no-change rerun does only this per file
                try:
                    st = stat(full)
                except OSError:  # gone between listing and hashing: keyed as absent
                    continue
                known = memo.get(full)
                if (
                    known is not None
                    and known[3] == st.st_mtime_ns
                    and known[4] == st.st_ctime_ns
                    and known[2] == st.st_size
                    and known[1] == st.st_ino
                    and known[0] == st.st_dev
                ):
                    files.append([keyed, known[5]])
                    continue
                try:
                    files.append([keyed, self.file_digest(full)])
                except OSError:
                    continue
            out.append([entry, files])
        return out

    def component(self, reads: Sequence[str]) -> str:
        """The ``reads`` component: the digest of every entry's matches (path as
        keyed and content digest); an entry matching nothing is ``[entry, []]``."""
        ident = tuple(reads)
        found = self._components.get(ident)
        if found is None:
            listing = self.listing(reads)
            found = digest.of_bytes(_listing_bytes(listing))
            self._components[ident] = found
            self._listings[found] = listing
            self._save_memo()
            self._keep_listing(found, listing)
        return found

    def _listing_path(self, value: str) -> Path | None:
        if self.cache_dir is None:
            return None
        hexed = value.removeprefix("sha256:")
        return self.cache_dir / "reads" / hexed[:2] / f"{hexed[2:]}.json"

    def _keep_listing(self, value: str, listing: Listing) -> None:
        where = self._listing_path(value)
        if where is None or where.exists():
            return
        # lazy: only _keep_listing() needs it (start-up)
        from crucible.core import atomic
        from crucible.run.cache._storefs import real_dirs

        assert self.cache_dir is not None
        # a link planted at reads/ or reads/<2 hex>/ is refused, not followed
        # (cache.md, "Nothing through a link planted in DIR"): the listing is
        # then not kept, and a miss says "changed reads"
        with contextlib.suppress(OSError):
            real_dirs(self.cache_dir, where.parent, set())
            atomic.write_bytes(where, _listing_bytes(listing), durable=False)

    def kept_listing(self, value: str) -> Listing | None:
        """The listing a ``reads`` digest was computed from (this run's, or kept
        in the cache dir by an earlier one), or None."""
        if value in self._listings:
            return self._listings[value]
        where = self._listing_path(value)
        if where is None:
            return None
        # lazy: core.fdio is not loaded with this module; only kept_listing() needs it
        from crucible.core.fdio import read_regular

        try:
            for parent in (where.parent.parent, where.parent):  # no link followed
                if not stat_mod.S_ISDIR(os.lstat(parent).st_mode):
                    return None
            loaded = canon.loads(read_regular(where, follow=False))
        except Exception:
            return None
        return loaded if isinstance(loaded, list) else None


def describe_change(before: Listing | None, now: Listing) -> str:
    """``read data/b.csv changed`` (or ``added``, ``removed``; ``reads entry 'x'
    added``) for the first difference, in entry and path order."""
    if before is None:
        return "changed reads"
    old = {str(e[0]): {str(p): d for p, d in e[1]} for e in before if len(e) == 2}
    for entry, files in now:
        was = old.get(entry)
        if was is None:
            return f"reads entry {entry!r} added"
        current = {p: d for p, d in files}
        for path in sorted(set(was) | set(current)):
            if path not in was:
                return f"read {path} added"
            if path not in current:
                return f"read {path} removed"
            if was[path] != current[path]:
                return f"read {path} changed"
    for entry in old:
        if entry not in {e[0] for e in now}:
            return f"reads entry {entry!r} removed"
    return "changed reads"
