"""A unit's cache key before it is staged (docs/spec/cache.md, "When a unit is keyed").

The one computation of a unit's key. Every component follows from the plan and
from what is settled in the state directory: the producers' records, the params, the reserved inputs, the
ancestors' captured files. :class:`Keyer` computes the same components from
those, with stage's own readers, without writing anything: an ``inputs/``
entry of ``index.json`` is built as stage builds it, minus the ``path`` and
``size`` the key leaves out, and each value's digest is taken over the bytes
stage would write. A hit then needs no workspace, no staging and no worker;
only a miss is staged. ``tests/run/test_cache_perf_key.py`` holds each ``input:``
component equal to the one read back from a staged workspace, over every kind of
input.

Anything stage would refuse (a plan/state mismatch, a producer that passed
without its field) raises :class:`crucible.core.errors.CrucibleError` here too:
the unit is then not keyed, and staging reports the refusal.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from crucible.core import canon, digest
from crucible.core.errors import InputRefused, OperationalError
from crucible.core.plan import Plan
from crucible.run.cache._reads import ReadsKeyer, describe_change
from crucible.run.cache._store import (
    CacheKey,
    FilesMemo,
    ancestor_files,
    explain_miss,
    fixed_components,
    scalar_digest,
)
from crucible.run.executors._environ import task_environment

# Stage's own readers, so a value is read exactly as staging reads it (a fold's
# instances with the fast reader, a declared value with the strict one).
from crucible.stage.readers import (
    RESERVED_INPUTS,
    RESERVED_STATE_NAMES,
    PlanView,
    TaskView,
    build_outcome,
    build_view,
    check_key,
    declared_entry,
    escape_key,
    input_name_problem,
    instance_item,
    load_params,
    loop_of,
    read_json,
    reserved_entry,
    scalar_bytes,
    staged_units,
    task_params,
    utf16_order,
    v1_dep_value,
)

__all__ = ["Keyer"]


def _digest_of(value: Any) -> str:
    return digest.of_bytes(canon.dumps(value))


def _value_digest(value: Any) -> str:
    """The digest of the bytes stage writes for ``value``."""
    return digest.of_bytes(scalar_bytes(value) or canon.dumps(value))


class Keyer:
    """Keys units of one plan in one state directory (one per process)."""

    def __init__(
        self,
        plan: Mapping[str, Any],
        state: Path,
        *,
        environ: Mapping[str, str],
        agent_cmd: str | None,
        emit_cap: int,
        pack_dir: str = "",
        cache_dir: Path | None = None,
        programs_changed_after: int | None = None,
        plan_view: PlanView | None = None,
    ) -> None:
        self.plan = plan
        #: --reuse keys an earlier run: a program changed since it started differs
        self.programs_changed_after = programs_changed_after
        #: (program, PATH) -> its key component, for this run (_cache_programs)
        self._programs: dict[tuple[str, str | None], str] = {}
        self.state = Path(state)
        self.environ = environ
        self.agent_cmd = agent_cmd
        self.emit_cap = emit_cap
        #: task -> its components that do not depend on the instance or the state
        self._fixed: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        #: params.json's identity when read, the params, and per task the
        #: digest of the params its units are handed (task_params)
        self._params: tuple[tuple[int, ...] | None, dict[str, Any]] | None = None
        self._params_digests: dict[str, str] = {}
        self._reserved_entries: dict[tuple[str, str], str] = {}
        self._files_memo: FilesMemo = {}
        self._reserved_root = str(self.state / "reserved")
        self._params_path = str(self.state / "params.json")
        #: the plan's view (the run's StateDir's, else built at the first key)
        self._pv: PlanView | None = plan_view
        #: the plan has no scored loop (checked at the first key)
        self._loop_checked = False
        #: what STATE/reserved/ held at its last listing, by the directory's identity
        self._reserved_listing: tuple[tuple[int, int] | None, frozenset[str]] | None = None
        #: inside :meth:`steady`: params.json and STATE/reserved/ were checked in
        #: this pass already (None: outside one, checked at every key)
        self._steady: set[str] | None = None
        #: declared reads (crucible.run.cache._reads): listed and hashed once per run
        self.reads = ReadsKeyer(pack_dir, cache_dir)

    def _view(self) -> PlanView:
        """The plan's view, built at the first key when the run handed none."""
        if self._pv is None:
            self._pv = build_view(self.plan)
        return self._pv

    def key(self, name: str, key: str | None) -> CacheKey:
        pv = self._view()
        if not self._loop_checked:
            if loop_of(pv) is not None:
                # A scored loop's revisions are staged by rules of their own (the
                # revision each producer is read at, kept files, the history budget):
                # such a plan is not cached yet (docs/spec/cache.md).
                raise InputRefused("a plan with a [loop] is not keyed before staging")
            self._loop_checked = True
        t = pv.task(name)
        check_key(pv, name, key)
        head, tail = self._fixed_of(t, pv.model)
        components = {**head, "instance": scalar_digest(key), **tail}
        ancestors = sorted(pv.file_ancestors(name))
        if pv.version >= 2:
            components.update(self._inputs_v2(pv, t, key, bool(ancestors)))
        else:
            components.update(self._inputs_v1(pv, t, key))
        if ancestors:
            components.update(ancestor_files(self.state, escape_key, ancestors, self._files_memo))
        if t.model.reads:
            components["reads"] = self.reads.component(t.model.reads)
        return CacheKey(name, key, components)

    def explain(self, previous: Mapping[str, str] | None, current: Mapping[str, str]) -> str:
        """Why a unit missed (crucible.run.cache._store.explain_miss), naming the
        declared read that changed when that is the first difference."""

        why = explain_miss(previous, current)
        if why == "changed reads" and previous is not None and "reads" in current:
            now = self.reads.kept_listing(current["reads"])
            if now is not None:
                before = previous.get("reads")
                was = self.reads.kept_listing(before) if before else []
                why = describe_change(was, now)
        return why

    def _fixed_of(self, t: TaskView, plan: Plan) -> tuple[dict[str, str], dict[str, str]]:
        fixed = self._fixed.get(t.name)
        if fixed is None:
            host_env = task_environment(plan.edition, t.model.env, self.environ)
            fixed = fixed_components(
                plan,
                t.model,
                t.raw,  # the key hashes the task as the plan spells it (deliberate)
                host_env,
                self.agent_cmd,
                self.emit_cap,
                self.programs_changed_after,
                self._programs,
            )
            self._fixed[t.name] = fixed
        return fixed

    # ----------------------------------------------------------------- IR v2

    def _inputs_v2(
        self, pv: PlanView, t: TaskView, key: str | None, has_files: bool
    ) -> dict[str, str]:
        # stage lays files under inputs/ only from ancestors that declare emits_files
        staged = self._files_staged(pv, t, key) if has_files else set()
        out: dict[str, str] = {}
        for name in utf16_order(t.model.inputs):
            problem = input_name_problem(name)
            if problem is not None:
                raise InputRefused(problem, where=f"plan:task {t.name}")
            entry = self._declared(pv, t, key, name, staged)
            out[f"input:{name}"] = _digest_of(entry)
        for name, value_digest in self._reserved(t, key).items():
            found = self._reserved_entries.get((name, value_digest))
            if found is not None:  # the same params for every unit: one digest
                out[f"input:{name}"] = found
                continue
            entry = {**reserved_entry(name), "value_staged": True, "digest": value_digest}
            out[f"input:{name}"] = _digest_of(entry)
            if len(self._reserved_entries) < 4096:
                self._reserved_entries[(name, value_digest)] = out[f"input:{name}"]
        return out

    def _reserved(self, t: TaskView, key: str | None) -> dict[str, str]:
        """The digests of the reserved inputs stage hands ``t`` (in its order:
        stage._inputs.reserved_values), params read once per run."""
        out: dict[str, str] = {}
        if t.kind in ("command", "evaluate"):  # agents never receive params
            out["params"] = self._params_digest(t)
        if key is not None:
            out["item"] = _value_digest(instance_item(self._view(), self.state, t.name, key))
        present = self._reserved_present()
        for name in RESERVED_STATE_NAMES:
            if f"{name}.json" in present:
                out[name] = _value_digest(read_json(self.state / "reserved" / f"{name}.json"))
        if t.epilogue:
            out["outcome"] = _value_digest(build_outcome(self._view(), self.state, t.name))
        return out

    @contextlib.contextmanager
    def steady(self) -> Iterator[None]:
        """A pass of keys during which nothing of this process writes params.json
        or STATE/reserved/ (the dispatcher's lookups of one turn: params.json is
        written at admission, reserved/ by an outer loop before the run): each is
        checked for a change once in the pass, not once per key (two ``stat``
        calls a unit were ~8 % of a fully cached rerun)."""
        outer, self._steady = self._steady, set()
        try:
            yield
        finally:
            self._steady = outer

    def _checked(self, what: str) -> bool:
        """True when ``what`` was checked already in this steady pass (and marks it)."""
        steady = self._steady
        if steady is None:
            return False
        if what in steady:
            return True
        steady.add(what)
        return False

    def _reserved_present(self) -> frozenset[str]:
        """The names in STATE/reserved/ (an outer loop's reserved inputs), listed
        again only when the directory changed (a name added, removed or
        renamed over changes its mtime): most runs have none at all."""
        known = self._reserved_listing
        if self._checked("reserved") and known is not None:
            return known[1]
        try:
            st = os.stat(self._reserved_root)
            ident: tuple[int, int] | None = (st.st_ino, st.st_mtime_ns)
        except (FileNotFoundError, NotADirectoryError):
            ident = None
        except OSError as exc:
            raise OperationalError(
                f"cannot list: {exc.strerror}", where=self._reserved_root
            ) from None
        known = self._reserved_listing
        if known is not None and known[0] == ident:
            return known[1]
        present: frozenset[str] = frozenset()
        if ident is not None:
            try:
                present = frozenset(os.listdir(self._reserved_root))
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError as exc:
                raise OperationalError(
                    f"cannot list: {exc.strerror}", where=self._reserved_root
                ) from None
        self._reserved_listing = (ident, present)
        return present

    def _params_digest(self, t: TaskView) -> str:
        """The digest of the params ``t`` is handed, params.json read again only
        when it changed (it is written once, at admission: most runs read it
        once). Tasks handed the same params share one digest."""
        if not self._checked("params") or self._params is None:
            try:
                st = os.stat(self._params_path)
                ident: tuple[int, ...] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except FileNotFoundError:
                ident = None  # the plan's defaults
            if self._params is None or self._params[0] != ident:
                self._params = (ident, load_params(self._view(), self.state))
                self._params_digests.clear()
        params = self._params[1]
        found = self._params_digests.get(t.name)
        if found is None:
            handed = task_params(self._view(), t.model, params)
            if handed is params:  # every param (most tasks): one digest
                found = self._params_digests.get("")  # no task is named ""
                if found is None:
                    found = self._params_digests[""] = _value_digest(handed)
            else:
                found = _value_digest(handed)
            self._params_digests[t.name] = found
        return found

    def _files_staged(self, pv: PlanView, t: TaskView, key: str | None) -> set[str]:
        """What stage lays under ``inputs/``: ``producer`` or ``producer/<escaped
        key>`` (stage's own describe pass, crucible.stage._inputs.staged_units)."""
        units, _ = staged_units(pv, self.state, t.name, key)
        return {u.staged for u in units}

    def _declared(
        self, pv: PlanView, t: TaskView, key: str | None, name: str, staged: set[str]
    ) -> dict[str, Any]:
        """The index entry stage writes for a declared input (stage's describe
        pass, crucible.stage._inputs.declared_entry), minus the path and size the
        key leaves out (cache.md): a fold's entries keep theirs, as staged."""
        entry = declared_entry(pv, self.state, t, key, name, staged, [], [])
        return {k: v for k, v in entry.items() if k not in ("path", "size")}

    # ----------------------------------------------------------------- IR v1

    def _inputs_v1(self, pv: PlanView, t: TaskView, key: str | None) -> dict[str, str]:
        obj: dict[str, Any] = {}
        for dep in t.needs:
            if dep in RESERVED_INPUTS:
                raise InputRefused(
                    f"task {t.name!r} needs a task named {dep!r}, which collides with the "
                    "reserved input of that name in v1 delivery"
                )
            obj[dep] = v1_dep_value(pv, self.state, t, dep, None)  # no loop: no revision
        digests = {name: _digest_of(value) for name, value in obj.items()}
        # a reserved value's bytes are the canonical JSON of it, as a member's are
        digests.update(self._reserved(t, key))
        # in the order of the staged file's members (canonical JSON: UTF-16 order)
        return {f"input:{name}": digests[name] for name in utf16_order(digests)}
