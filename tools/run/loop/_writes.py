"""What the scored loop writes through its engine (:class:`crucible.run.engine._host.LoopHost`):
loop.json in its durability order, the body tasks' records and their events.

The loop's one ordering rule (docs/spec/run.md, "Order between batches"): the
loop.json that says the loop finished is durable BEFORE any body task's plain
record is written, for a resume takes those records as the loop being over. A
group-commit batch is made durable as a whole (one syncfs gives no order inside
it, and writeback may store any of its files first), so loop.json joins one
batch and the records it orders wait for that batch to be durable: they are
written then, and ride the next batch. Nothing here fsyncs on the scheduling
thread inside the dispatcher's turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from crucible.core import atomic, canon
from crucible.core.errors import InputRefused
from crucible.run.loop._history import LoopHistory
from crucible.run.loop._revision import SKIPPED
from crucible.run.loop._scoring import FAILED
from crucible.run.loop._spec import revision_key
from crucible.run.session import events

if TYPE_CHECKING:
    from crucible.run.engine._host import LoopHost

__all__ = ["NO_KEPT", "LoopWriter"]

NO_KEPT = "loop kept no revision"


class LoopWriter:
    """The loop's writes over ``host``, for the body tasks in ``order`` and the
    loop's ``history`` (loop.json)."""

    def __init__(self, host: LoopHost, history: LoopHistory, order: Sequence[str]) -> None:
        self.d = host
        self.history = history
        self.order = order

    def in_place(self) -> bool:
        """Outside the dispatcher's turns (a resume's start-up, before any unit
        runs) no batch is waited for: what the loop writes is fsynced in place,
        as everything read at start-up is durable."""
        return not self.d.in_turns

    def durable_then(self, then: Callable[[], None], *, write: bool = True) -> None:
        """Make loop.json (as written now, or as read at a resume's start when
        ``write`` is false) durable, then call ``then``: once the next batch is
        durable inside the turns, at once (after an fsync here) outside them."""
        path = self.history.path
        if self.in_place():
            if write:
                self.history.write(durable=True)
            else:
                # lazy: only durable_then() needs it (start-up)
                from crucible.run.session._log import _fsync_path

                _fsync_path(str(path))
                _fsync_path(str(path.parent))
            then()
            return
        if write:
            self.history.write()
        self.d.log.sync((str(path), str(path.parent)))
        self.d.after_durable(then)

    def _wrote(self, task: str, key: str | None, durable: bool) -> None:
        """A record written without fsync rides the next batch."""
        if not durable:
            self.d.wrote(task, key)

    def clear_revision(self, n: int) -> None:
        """Revision ``n``'s records an interrupted session left (only on a
        resume): an interrupted revision reruns whole. Each tombstone rides the
        next batch, even at start-up: nothing reads revision n's records before
        one of its new ones is durable, and each follows the tombstone in the
        same file."""
        d = self.d
        key = revision_key(n)
        for t in self.order:
            if key in d.state_dir.load_all(t):
                d.state_dir.remove_result(t, key, durable=False)
                d.wrote(t, key)

    def write_reserved(self, n: int) -> None:
        """The reserved inputs for revision ``n`` (crucible.run.loop._reserved)."""
        # lazy: run.loop._reserved is not loaded with this module; only write_reserved() needs it
        from crucible.run.loop import _reserved as _loop_reserved

        _loop_reserved.write(self.d, n, self.history.revisions)

    def settle_skipped(self, note: str) -> None:
        """The loop never runs: every body task settles skipped."""
        d = self.d
        durable = self.in_place()
        for t in self.order:
            d.state_dir.record_settled(t, status=SKIPPED, note=note, durable=durable)
            self._wrote(t, None, durable)
            d.log.emit(events.task_finished(task=t, status=SKIPPED, note=note))
            d.add_units(1)
            d.count_settled(SKIPPED)
            d.settle(t, SKIPPED)

    def record_decided(self, name: str, key: str, status: str, note: str) -> None:
        """A revision unit settled without running (its join, its condition)."""
        d = self.d
        durable = self.in_place()
        d.state_dir.record_settled(name, status=status, note=note, key=key, durable=durable)
        self._wrote(name, key, durable)
        d.log.emit(events.task_finished(task=name, key=key, status=status, note=note))
        d.count_settled(status)

    def conclude(self) -> None:
        """The body tasks settle as the kept revision: its records become their
        plain records (the files stay in the revision's directory, where stage
        finds them for every task outside the body). Called once the loop.json
        that says the loop finished is durable."""
        d = self.d
        history = self.history
        durable = self.in_place()
        for t in self.order:
            path = d.layout.result_path(t)
            if history.kept is None:
                note = NO_KEPT
                if not history.revisions:
                    # No revision ran (a time budget spent before the first): no
                    # unit of the body settled, so none was counted or listed;
                    # the run fails by these tasks, and its last line says so.
                    note = f"{NO_KEPT}: no revision ran (stopped by {history.stop_reason})"
                    d.note_failed(t)
                d.state_dir.record_settled(t, status=FAILED, note=note, durable=durable)
                self._wrote(t, None, durable)
                status = FAILED
            else:
                rec = d.state_dir.load_result(t, revision_key(history.kept))
                if rec is None:  # the kept revision was kept because its units settled
                    raise InputRefused(
                        f"kept revision {history.kept} of {t!r} has no record", where=str(path)
                    )
                plain = {k: v for k, v in rec.items() if k != "key"}
                plain["extra"] = {**(rec.get("extra") or {}), "revision": history.kept}
                atomic.write_bytes(path, canon.dumps(plain), durable=durable)
                self._wrote(t, None, durable)
                status = str(rec.get("status", FAILED))
            d.settle(t, status)
