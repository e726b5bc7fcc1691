"""``--dry-run --cache DIR``: per unit, hit or miss and why (docs/spec/cache.md).

A unit's key follows from its producers' results (crucible.run.cache._keyer).
The dry run keys units in a throw-away shadow state in a temporary directory
(the state dir is never written): the admitted plan and params, the real
state's settled records, files, reserved inputs and instance lists, and, in
plan order, each unit keyed and looked up; a hit's record and files are
restored into the shadow so its consumers can be keyed in turn. A unit downstream of one that will run cannot be keyed before
that run: it says so.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from crucible.core import atomic
from crucible.core.errors import CrucibleError
from crucible.core.plan import Ref, Task
from crucible.stage import StateDir, escape_key

__all__ = ["explain_lines"]


def _ancestors(tasks: Mapping[str, Task], name: str) -> list[str]:
    seen: list[str] = []
    stack = list(tasks[name].needs)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.append(n)
            stack.extend(tasks[n].needs)
    return seen


def _shadow(state: Path, root: Path, plan_bytes: bytes, params: Any) -> Path:
    shadow = root / "state"
    shadow.mkdir()
    for part in ("results", "files", "reserved", "instances"):
        src = state / part
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, shadow / part, symlinks=True)
    atomic.write_json(shadow / "params.json", params)
    atomic.write_bytes(shadow / "plan.json", plan_bytes, durable=False)
    return shadow


def _list_instances(shadow: Path, task: Task, params: Any) -> None:
    """A static fan-out's instances file in the shadow, as the run writes it at
    admission (a producer-mapped task's comes with its producer's records)."""
    # lazy: run.engine._matrix is not loaded with this module; only _list_instances() needs it
    from crucible.run.engine._matrix import expand, is_static, write_instances

    if is_static(task):
        with contextlib.suppress(CrucibleError, OSError):
            write_instances(shadow, task.name, expand(task, params, shadow))


def _mapped_instances(
    shadow: StateDir,
    tasks: Mapping[str, Task],
    name: str,
    unknown: set[str],
) -> list[str] | None:
    """A producer-mapped task's instance keys once the dry run has restored its
    producer (a hit) into the shadow; None while an ancestor's result is unknown."""
    if any(a in unknown for a in _ancestors(tasks, name)):
        return None
    try:
        return [key for key, _ in shadow.map_items(name)]
    except (CrucibleError, OSError):
        return None


def explain_lines(
    lines: list[dict[str, Any]],
    *,
    state_dir: StateDir,
    admission: Any,
    options: Any,
    environ: Mapping[str, str],
    warn: Callable[[str], None],
) -> list[dict[str, Any]]:
    """``lines`` (crucible.run.engine._selection.dry_run_lines) with ``cache`` (hit, miss,
    off, unknown) on each unit that would run; a hit's action is ``cached``."""
    # lazy: only explain_lines() needs it (start-up)
    from crucible.run.cache._keyer import Keyer
    from crucible.run.cache._unit import UnitCache, cacheable

    plan = admission.plan
    tasks = admission.model.by_name
    out = [dict(line) for line in lines]
    with tempfile.TemporaryDirectory(prefix="crucible-dry-cache-") as tmp:
        try:
            shadow = _shadow(options.state, Path(tmp), admission.data, admission.params)
        except (OSError, CrucibleError) as exc:
            warn(f"cache: cannot prepare the dry run's keys: {exc}")
            return out
        shadow_dir = state_dir.over(shadow)  # the run's plan view, over the shadow
        keyer = Keyer(
            plan,
            shadow,
            plan_view=state_dir.view,
            environ=environ,
            agent_cmd=options.agent_cmd,
            emit_cap=admission.emit_cap,
            pack_dir=admission.pack_dir,
            cache_dir=options.cache,
        )
        cache = UnitCache(options.cache, keyer)
        unknown: set[str] = set()  # tasks whose result this dry run cannot know
        instances: dict[str, list[str]] = {}
        hits: dict[str, int] = {}
        folded: set[str] = set()
        listed: set[str] = set()

        def fold_before(current: str) -> None:
            """A mapped task whose instances all hit folds, for its consumers."""
            for name, keys in instances.items():
                if name != current and name not in folded:
                    folded.add(name)
                    if name not in unknown and hits.get(name) == len(keys):
                        with contextlib.suppress(CrucibleError, OSError):
                            shadow_dir.settle_fold(name, keys)
                    else:
                        unknown.add(name)

        try:
            i = 0
            while i < len(out):
                line = out[i]
                i += 1
                if line["action"] != "run":
                    continue
                name, key = line["task"], line.get("key")
                fold_before(name)
                task = tasks[name]
                if key is None and isinstance(task.map, Ref):
                    found = _mapped_instances(shadow_dir, tasks, name, unknown)
                    if found:  # its producer hits: its instances are known now
                        out[i - 1 : i] = [
                            {"task": name, "key": k, "action": "run", "reason": "new"}
                            for k in found
                        ]
                        i -= 1
                        continue
                if key is not None:
                    instances.setdefault(name, []).append(key)
                    if name not in listed:  # a static fan-out: its items, for the keyer
                        listed.add(name)
                        _list_instances(shadow, task, admission.params)
                blocked = [a for a in _ancestors(tasks, name) if a in unknown]
                why: str | None = None
                if not cacheable(task):
                    line["cache"], why = "off", "cache = false: always runs"
                elif blocked:
                    line["cache"], why = "unknown", f"cache: keyed once {blocked[0]!r} ran"
                elif task.fans_out and key is None:
                    line["cache"], why = "unknown", "cache: keyed per instance"
                if why is not None:
                    unknown.add(name)
                    line["reason"] += f"; {why}"
                    continue
                try:
                    ck = cache.keyer.key(name, key)
                except CrucibleError as exc:
                    unknown.add(name)
                    line["cache"] = "unknown"
                    line["reason"] += f"; cache: cannot stage its inputs ({exc})"
                    continue
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    warn(f"cache: cannot key {name!r}: {exc}")
                    unknown.add(name)
                    line["cache"] = "unknown"
                    continue
                record = cache.lookup(ck, 1)
                for w in cache.take_warnings():
                    warn(w)
                if record is not None:
                    line["action"], line["cache"], line["cache_key"] = "cached", "hit", ck.digest
                    line["reason"] = "cache hit: nothing it depends on changed"
                    if record.get("sandbox") is True:
                        # it ran sandboxed when recorded: its reads were enforced
                        line["reason"] += "; sandboxed: its key is complete"
                    hits[name] = hits.get(name, 0) + 1
                    continue
                if key is None:
                    unknown.add(name)
                line["cache"] = "miss"
                line["cache_key"] = ck.digest
                last = cache.cache.last_components(name, key, escape_key)
                line["reason"] += f"; cache miss: {keyer.explain(last, ck.components)}"
        finally:
            cache.close()
    return out
