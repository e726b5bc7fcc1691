"""Consumer side: a task's inputs/ tree, its index, its environment.

IR v2 (edition 3): one read-only file per declared input under
``inputs/@values/`` (a directory per fold), reserved inputs under their own
names, and ``index.json``. IR v1 (editions 1–2): one JSON object with every
direct dependency's whole output, in ``inputs/@inputs.json``. Every edition:
each ancestor's captured emits_files under ``inputs/<producer>/``.
Normative text: docs/spec/inputs.md.
"""

from __future__ import annotations

import copy
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from crucible.core import canon, digest, structs
from crucible.core.canon import MAX_SAFE_INTEGER
from crucible.core.contract import RESERVED_INPUTS
from crucible.core.errors import InputRefused, OperationalError, ParseError
from crucible.core.fdio import read_file, write_all
from crucible.core.fsio import make_dirs, remove_tree, walk_tree
from crucible.core.plan import Task
from crucible.core.refs import RefMissing
from crucible.core.structs import dataclass
from crucible.stage._described import Described
from crucible.stage._empty import (
    drop_old_tree,
    empty_values_dir,
    may_stage_nothing,
    nothing_to_stage,
)
from crucible.stage._files import FILES_RUN_MAX
from crucible.stage._fsio import TMP_PREFIX, swap_in_dir
from crucible.stage._layout import RESERVED_STATE_NAMES, StateLayout
from crucible.stage._loop import (
    kept_revision,
    kept_units,
    loop_of,
    producer_key,
    read_meta,
    revision_key,
    revision_of,
    revision_unit,
)
from crucible.stage._names import escape_key
from crucible.stage._plan import PlanView, TaskView, in_plan
from crucible.stage._records import check_key, load_all, load_result
from crucible.stage._share import Unit, refresh_held, stage_units, units_of, verify_consumer
from crucible.stage._store import as_path

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "INPUTS_ENV_MAX",
    "RESERVED_INPUTS",
    "V1_FILE",
    "VALUES_DIR",
    "Described",
    "StagedInputs",
    "check_inputs",
    "declared_entry",
    "describe_inputs",
    "map_items",
    "refresh_inputs",
    "stage_inputs",
    "staged_units",
    "task_params",
    "utf16_order",
]

INPUTS_ENV_MAX = 65536
VALUES_DIR = "@values"
INDEX_NAME = "index.json"
V1_FILE = "@inputs.json"
#: v1's member for what the history budget dropped (a task name never starts with "@")
V1_HISTORY = "@history"
INDEX_FORMAT = "crucible.inputs-index/1"


def utf16_order(keys: Any) -> list[str]:
    """Keys in canonical JSON (RFC 8785) order: by UTF-16 code units."""
    return sorted(keys, key=lambda k: k.encode("utf-16-be", "surrogatepass"))


@dataclass(frozen=True)
class StagedInputs:
    """What :func:`stage_inputs` laid down. ``env`` is what the task must get."""

    env: dict[str, str]
    inputs_dir: Path
    values_dir: Path | None
    index: dict[str, Any] | None
    inputs_file: Path | None
    value: dict[str, Any] | None
    files_bytes: int
    files_staged: tuple[str, ...]
    #: the producer units whose files it was handed (3.4): what
    #: :func:`refresh_inputs` and :func:`check_inputs` are given, so a unit
    #: handed none (most) pays for no second look at the plan and the state
    held: tuple[Unit, ...] = ()


# -- map items ---------------------------------------------------------------

# (state, task, map) -> (record file identity, items, key -> position). Dispatch
# stages every instance of a 10,000-wide fan-out; re-reading the source record
# (or scanning the items) for each would be O(n²).
_Items = tuple[tuple[int, int, int], list[tuple[str, Any]], dict[str, int]]
_items_cache: dict[tuple[str, str], _Items] = {}


def _items_entry(
    pv: PlanView, state: Path, task: str
) -> _Items | tuple[None, list[tuple[str, Any]], dict[str, int]]:
    t = pv.task(task)
    if t.map is None:
        raise InputRefused(f"task {task!r} is not mapped")
    if t.listed:
        return _listed_entry(as_path(state), task)
    producer, fld = t.map  # (a map over a mapped task, or with a path, is listed)
    state = as_path(state)
    path = StateLayout(state).result_path(producer)
    try:
        st = path.stat()
        ident: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        ident = None
    cache_key = (str(state.absolute()), f"{task}\x00{producer}\x00{fld}")
    hit = _items_cache.get(cache_key)
    if ident is not None and hit is not None and hit[0] == ident:
        return hit
    rec = load_result(state, producer)
    if rec is None:
        raise InputRefused(
            f"map source {producer!r} of task {task!r} has not settled", where=str(path)
        )
    if rec["status"] != "passed":
        raise InputRefused(
            f"map source {producer!r} of task {task!r} is {rec['status']}, not passed",
            where=str(path),
        )
    output = rec.get("output")
    if not isinstance(output, dict) or fld not in output:
        raise InputRefused(f"map source {producer!r} carries no field {fld!r}", where=str(path))
    value = output[fld]
    if isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        items = [(k, value[k]) for k in utf16_order(value)]
    else:
        raise InputRefused(
            f"task {task!r} maps over {producer}.{fld}, which is not an array or object",
            where=str(path),
        )
    positions = {k: i for i, (k, _) in enumerate(items)}
    if ident is None:
        return None, items, positions
    entry = (ident, items, positions)
    _items_cache[cache_key] = entry
    return entry


def instances_path(state: Path, task: str) -> Path:
    """``STATE/instances/<task>.json``: the instances the dispatcher expanded for a
    listed fan-out (docs/spec/run.md, "Instances file")."""
    return StateLayout(as_path(state)).instances_path(task)


def _listed_entry(state: Path, task: str) -> _Items | tuple[None, list[tuple[str, Any]], dict[str, int]]:
    path = instances_path(state, task)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputRefused(
            f"task {task!r} has not been expanded (no instances file)", where=str(path)
        ) from None
    ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    cache_key = (str(state.absolute()), f"{task}\x00@instances")
    hit = _items_cache.get(cache_key)
    if hit is not None and hit[0] == ident:
        return hit
    doc = _read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
        raise InputRefused("not an instances file", where=str(path))
    items = [(str(e["key"]), e.get("item")) for e in doc["instances"]]
    positions = {k: i for i, (k, _) in enumerate(items)}
    entry = (ident, items, positions)
    _items_cache[cache_key] = entry
    return entry


def map_items(pv: PlanView, state: Path, task: str) -> list[tuple[str, Any]]:
    """(raw key, item) of a mapped task, in item order: an array gives "0", "1", …;
    an object gives its keys in canonical JSON order (UTF-16 code units)."""
    return list(_items_entry(pv, state, task)[1])


def instance_item(pv: PlanView, state: Path, task: str, key: str) -> Any:
    _, items, positions = _items_entry(pv, state, task)
    if key not in positions:
        raise InputRefused(f"task {task!r} has no instance {key!r} (plan/state mismatch)")
    return items[positions[key]][1]


# -- reserved inputs -----------------------------------------------------------


#: what _read_json(optional=True) returns for a file that does not exist
_ABSENT = object()


def _read_json(path: Path, *, optional: bool = False) -> Any:
    try:
        data = read_file(path)
    except OSError as exc:
        if optional and isinstance(exc, FileNotFoundError):
            return _ABSENT
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None
    try:
        return canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=str(path)) from None


#: str(path) -> (its identity when read, the parsed params): a dispatcher
#: stages every unit of a run with the same params.json, written at admission
_params_cache: dict[str, tuple[tuple[int, int, int, int], dict[str, Any]]] = {}


def load_params(pv: PlanView, state: Path) -> dict[str, Any]:
    """``STATE/params.json``; without it, the plan's defaults (every param needs one).

    A file read before is parsed again only when its identity (inode, size,
    mtime, ctime) changed: one stat per unit instead of an open, a read and a
    parse. The caller gets its own copy (a value may be a container)."""
    where = _state_file(state, "params")
    try:
        st = os.stat(where)
    except OSError:
        st = None
    if st is not None:
        ident = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        hit = _params_cache.get(where)
        if hit is not None and hit[0] == ident:
            return copy.deepcopy(hit[1]) if hit[1] else {}
    path = Path(where)
    params = _read_json(path, optional=True)
    if params is not _ABSENT:
        if not isinstance(params, dict):
            raise InputRefused("params must be a JSON object", where=str(path))
        if st is not None:
            _params_cache[where] = (ident, copy.deepcopy(params))
        return params
    params = {}
    for name, spec in pv.model.workflow.params.items():
        if not spec.has_default:
            raise InputRefused(
                f"param {name!r} has no default and {path} does not exist", where=str(path)
            )
        params[name] = copy.deepcopy(spec.default)
    return params


def _fields(rec: dict[str, Any] | None, t: TaskView, version: int) -> dict[str, Any]:
    output = rec.get("output") if rec else None
    if not isinstance(output, dict):
        return {}
    if version == 1:
        return output
    return {k: v for k, v in output.items() if k not in t.emits}


def build_outcome(pv: PlanView, state: Path, task: str) -> dict[str, Any]:
    """The epilogue's ``outcome``: every other task's status and note, and its
    fields (v2: the undeclared ones; v1: all), uncapped."""
    tasks: dict[str, Any] = {}
    for name in pv.order:
        if name == task:
            continue
        t = pv.tasks[name]
        rec = load_result(state, name)
        entry: dict[str, Any] = {
            "status": rec["status"] if rec else "absent",
            "note": rec["note"] if rec else "",
        }
        if rec and rec.get("tolerated") is True:  # IR v3 (run/engine/_control.py)
            entry["tolerated"] = True
        if t.map is None:
            entry["fields"] = _fields(rec, t, pv.version)
        else:
            instances = []
            for k in rec.get("keys", []) if rec else []:
                irec = load_result(state, name, k)
                instances.append(
                    {
                        "key": k,
                        "status": irec["status"] if irec else "absent",
                        "note": irec["note"] if irec else "",
                        "fields": _fields(irec, t, pv.version),
                        **({"tolerated": True} if irec and irec.get("tolerated") is True else {}),
                    }
                )
            entry["instances"] = instances
        tasks[name] = entry
    if pv.version >= 3:  # the run so far: failed when a regular task failed untolerated
        failed = any(
            e["status"] == "failed" and not e.get("tolerated") and not pv.tasks[n].epilogue
            for n, e in tasks.items()
        )
        out: dict[str, Any] = {"status": "failed" if failed else "passed", "tasks": tasks}
        if loop_of(pv) is not None:  # the scored loop's end (docs/spec/loop.md)
            from crucible.stage._loop_outcome import loop_outcome

            out["loop"] = loop_outcome(state)
        return out
    return {"tasks": tasks}


def task_params(pv: PlanView, task: Task, params: dict[str, Any]) -> dict[str, Any]:
    """The params a unit of ``task`` is handed (IR v3): those its ``params`` key
    lists (all when it has none), less those its fan-out reads
    (:attr:`crucible.core.plan.Task.fanout_params`), which reach each instance
    as its item. Earlier IR versions hand every param."""
    if pv.version < 3:
        return params
    listed = task.params
    dropped = task.fanout_params
    if listed is None and not dropped:
        return params
    return {
        k: v for k, v in params.items() if (listed is None or k in listed) and k not in dropped
    }


def reserved_values(pv: PlanView, state: Path, task: str, key: str | None) -> dict[str, Any]:
    """The reserved inputs that apply to this task, by name, in RESERVED_INPUTS order."""
    t = pv.task(task)
    layout = StateLayout(state)
    out: dict[str, Any] = {}
    if t.kind in ("command", "evaluate"):  # agents never receive params
        out["params"] = task_params(pv, t.model, load_params(pv, state))
    if key is not None and revision_of(key) is None:  # a revision of a loop body has no item
        out["item"] = instance_item(pv, state, task, key)
    lv = loop_of(pv)
    if lv is not None and not lv.sees_reserved(pv, task):
        present: set[str] = set()  # before or beside the loop: not its inputs
    else:
        present = _listing(layout)
    for name in RESERVED_STATE_NAMES:
        if f"{name}.json" in present:
            out[name] = _read_json(layout.reserved_path(name))
    if t.epilogue:
        out["outcome"] = build_outcome(pv, state, task)
    return out


#: (str(state), which) -> the path of STATE's params.json or reserved/, as the
#: layout spells it: two Path joins a unit less
_state_files: dict[tuple[str, str], str] = {}


def _state_file(state: Path, which: str) -> str:
    key = (str(state), which)
    found = _state_files.get(key)
    if found is None:
        layout = StateLayout(state)
        found = str(layout.params_path if which == "params" else layout.reserved_root)
        _state_files[key] = found
    return found


def _listing(layout: StateLayout) -> set[str]:
    # One listing instead of a stat per name: most runs have no reserved/ at all.
    try:
        return set(os.listdir(_state_file(layout.state, "reserved")))
    except (FileNotFoundError, NotADirectoryError):
        return set()
    except OSError as exc:
        raise OperationalError(
            f"cannot list: {exc.strerror}", where=str(layout.reserved_root)
        ) from None


# -- producers -----------------------------------------------------------------


def _check_join(t: TaskView, producer: str, rec: dict[str, Any] | None) -> str:
    """An epilogue reports on the run whatever happened, so it is staged as a
    settled join whatever its ``join`` says (our choice)."""
    status = rec["status"] if rec else "absent"
    if t.join == "all" and not t.epilogue and status != "passed":
        raise InputRefused(
            f"task {t.name!r} joins all, but producer {producer!r} is {status} "
            f"(plan/state mismatch: it should not run)"
        )
    return status


def reserved_entry(name: str) -> dict[str, Any]:
    """The members of a reserved input's index entry that do not depend on its
    value (the cache keyer builds the same entry before staging)."""
    return {
        "name": name,
        "kind": "reserved",
        "producer": None,
        "field": None,
        "type": "object" if name in ("params", "outcome") else "any",
        "status": "passed",
        "note": "",
        "fold": False,
        "files_staged": False,
    }


def _v1_dep_value(pv: PlanView, state: Path, t: TaskView, dep: str, key: str | None) -> Any:
    rec = load_result(state, dep, key)
    _check_join(t, dep, rec)
    if rec is None:
        return None
    if pv.task(dep).map is None:
        return rec.get("output")
    values = []
    for k in rec.get("keys", []):
        irec = load_result(state, dep, k)
        values.append(irec.get("output") if irec else None)
    return values


# -- writing -----------------------------------------------------------------


def _write_readonly(path: Path | str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def _scalar_bytes(value: Any) -> bytes | None:
    """Canonical bytes of a string, a safe integer, a boolean or null without
    the domain walk (a fold stages 10,000 of them); None for anything else.
    orjson's bytes equal RFC 8785 for these (canonical-json.md)."""
    t = type(value)
    if (
        t is str
        or t is bool
        or value is None
        or (t is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    ):
        try:
            return orjson.dumps(value)
        except TypeError:  # a lone surrogate: let canon.dumps refuse it properly
            return None
    return None


def _index_bytes(index: dict[str, Any]) -> bytes:
    """The index's canonical bytes. Its object keys are stage's own ASCII member
    names (raw keys appear only as string values) and it holds no floats and only
    sizes as integers, which is exactly where orjson's sorted output equals
    RFC 8785 (canon's fast path, without its walk over 10,000 entries)."""
    try:
        return orjson.dumps(index, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return canon.dumps(index)


def _input_name_problem(name: str) -> str | None:
    if not isinstance(name, str) or name in ("", ".", ".."):
        return f"input name {name!r} cannot be a file name"
    if "/" in name or "\\" in name or "\x00" in name or name.startswith("@"):
        return f"input name {name!r} holds a path separator, NUL or a leading '@'"
    if name in RESERVED_INPUTS or name == INDEX_NAME:
        return f"input name {name!r} is reserved"
    if len(name.encode("utf-8", "surrogatepass")) > 255:
        return f"input name {name[:40]!r}… is too long for a file name"
    return None


def _ancestor_units(
    pv: PlanView, state: Path, task: str, key: str | None, anc: str
) -> list[Unit]:
    """``anc``'s captured units as ``task`` (instance ``key``) is handed them:
    a loop body producer's are those of the revision it reads (3.6)."""
    at = pv.tasks[anc]
    StateLayout(state).files_dir(anc)  # checks the name
    pkey = producer_key(pv, state, task, key, anc)
    if pkey is not None:
        unit = revision_unit(state, anc, pkey, anc)
        units = [unit] if unit.store.is_dir() else []
    else:
        units = units_of(state, anc, at.map is not None)
    if at.temp_files and anc not in pv.tasks[task].needs:
        # temporaries reach the producer's direct dependants only (run.md,
        # "Temporary files"): freed once they settled, never promised further
        units = [structs.replace(u, skip=at.temp_files) for u in units]
    return units


def staged_units(
    pv: PlanView, state: Path, task: str, key: str | None
) -> tuple[list[Unit], list[str]]:
    """Every ancestor's captured units as ``task`` (instance ``key``) is handed
    them under ``inputs/<ancestor>/``, and the mapped ancestors whose directory
    is made even without units (3.4). Reads only."""
    units: list[Unit] = []
    roots: list[str] = []
    for anc in pv.file_ancestors(task):
        at = pv.tasks[anc]
        found = _ancestor_units(pv, state, task, key, anc)
        if at.map is not None and (state / "files" / anc).is_dir():
            roots.append(anc)
        units.extend(found)
    return units, roots


def _value_entry(rel: str, value: Any, files: list[tuple[str, bytes]]) -> dict[str, Any]:
    """The index members of one value file at ``rel`` (workspace-relative); its
    bytes are appended to ``files`` (relative to ``inputs/``)."""
    data = _scalar_bytes(value) or canon.dumps(value)
    files.append((rel[len("inputs/") :], data))
    return {"value_staged": True, "size": len(data), "digest": digest.of_bytes(data), "path": rel}


_EMPTY_VALUE = {"value_staged": False, "size": None, "digest": None, "path": None}


def declared_entry(
    pv: PlanView,
    state: Path,
    t: TaskView,
    key: str | None,
    name: str,
    files_staged: set[str],
    files: list[tuple[str, bytes]],
    dirs: list[str],
) -> dict[str, Any]:
    """The index entry of declared input ``name`` of ``t`` (3.1, 3.5); the value
    files it stages go to ``files``, a fold's directory to ``dirs``."""
    spec = t.model.inputs[name]  # the model parsed its reference (crucible.core.refs)
    producer, fld = spec.producer, spec.field
    if producer not in t.needs:
        raise InputRefused(
            f"input {name!r} of task {t.name!r} reads {producer!r}, not a direct dependency"
        )
    pt = pv.task(producer)
    pkey = producer_key(pv, state, t.name, key, producer) if pt.map is None else None
    rec = load_result(state, producer, pkey)
    status = _check_join(t, producer, rec)
    rel = f"inputs/{VALUES_DIR}/{name}"
    entry: dict[str, Any] = {
        "name": name,
        "kind": "declared",
        "producer": producer,
        "field": fld,
        "type": spec.type,
        "status": status,
        "note": rec["note"] if rec else "",
        "fold": pt.map is not None,
    }
    if pt.map is None:
        entry["files_staged"] = producer in files_staged and _captured_any(rec)
        output = rec.get("output") if rec else None
        if isinstance(output, dict) and fld in output:
            value = output[fld]
            if spec.ref.path:  # a.items[0], a.config.region (edition 4)
                try:
                    value = spec.ref.at(value)
                except RefMissing as exc:
                    # the consumer fails with it (a missing element is no value)
                    raise InputRefused(f"input {name!r}: {exc.message}") from None
            entry.update(_value_entry(rel, value, files))
        elif status == "passed":
            raise InputRefused(
                f"producer {producer!r} passed without its declared field {fld!r} "
                f"(plan/state mismatch)",
                where=str(StateLayout(state).result_path(producer)),
            )
        else:
            entry.update(_EMPTY_VALUE)
        return entry
    entry["files_staged"] = False
    if rec is None:
        entry.update(_EMPTY_VALUE)
        entry["entries"] = []
        return entry
    dirs.append(rel[len("inputs/") :])
    entries, total = _fold_entries(state, producer, fld, rec, rel, files_staged, files)
    entry["files_staged"] = any(e["files_staged"] for e in entries)
    entry.update({"value_staged": True, "size": total, "digest": None, "path": rel})
    entry["entries"] = entries
    return entry


def _captured_any(record: dict[str, Any] | None) -> bool:
    """Whether a unit's record lists a captured file: a failed attempt that
    captured nothing leaves an empty store, and nothing of it is staged."""
    return bool(record and record.get("files"))


def _fold_entries(
    state: Path,
    producer: str,
    fld: str,
    rec: dict[str, Any],
    rel: str,
    files_staged: set[str],
    files: list[tuple[str, bytes]],
) -> tuple[list[dict[str, Any]], int]:
    """A fold's entries, one per instance record in item order, and their bytes.
    The hot loop of a wide fold: one read of the producer's packed records
    (the one place that reads a fold's instance records)."""
    entries = []
    total = 0
    instances = _instance_records(state, producer)
    for k in rec.get("keys", []):
        esc = escape_key(k)
        irec = instances.get(k)
        istatus = irec["status"] if irec else "absent"
        e: dict[str, Any] = {
            "key": k,
            "name": esc,
            "status": istatus,
            "note": irec["note"] if irec else "",
            "files_staged": f"{producer}/{esc}" in files_staged and _captured_any(irec),
        }
        output = irec.get("output") if irec else None
        if isinstance(output, dict) and fld in output:
            e.update(_value_entry(f"{rel}/{esc}", output[fld], files))
            total += e["size"]
        elif istatus == "passed":
            raise InputRefused(
                f"instance {k!r} of {producer!r} passed without its declared field {fld!r}"
            )
        else:
            e.update(_EMPTY_VALUE)
        entries.append(e)
    return entries, total


def _store_bytes(unit: Unit) -> int:
    """The bytes of a unit's captured files, as its published copy holds them
    (built from the store and checked against its digests when it is linked)."""
    total = 0
    for rel in walk_tree(str(unit.store), max_depth=100_000):
        st = os.lstat(f"{unit.store}/{rel}")
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def describe_inputs(
    pv: PlanView,
    state: Path,
    task: str,
    key: str | None = None,
    *,
    reserved: dict[str, Any] | None = None,
) -> Described:
    """What ``task`` (or its instance ``key``) is staged, without writing
    anything: the values and their index entries, the units whose files are
    linked, the environment. Refuses what staging refuses. ``reserved``: its
    :func:`reserved_values`, when the caller has them already."""
    t = pv.task(task)
    check_key(pv, task, key)
    state = as_path(state)
    if reserved is None:
        reserved = reserved_values(pv, state, task, key)
    units, roots = staged_units(pv, state, task, key)
    files_staged = {u.staged for u in units}
    kept: list[Unit] = []
    kept_files: list[dict[str, Any]] = []
    if "kept" in reserved:
        kept = kept_units(pv, state, reserved["kept"])
        kkey = revision_key(kept_revision(reserved["kept"]) or 1)
        for u in kept:
            kept_files.append(
                {
                    "producer": u.staged.split("/", 1)[1],
                    "key": kkey,
                    "path": f"inputs/{u.staged}",
                    "size": _store_bytes(u),
                }
            )
    history_meta = read_meta(state).get("history") if "history" in reserved else None
    files: list[tuple[str, bytes]] = []
    dirs: list[str] = []
    if pv.version < 2:
        obj = _v1_object(pv, state, t, key, reserved, history_meta)
        data = canon.dumps(obj)
        files.append((V1_FILE, data))
        text = data.decode("utf-8") if len(data) <= INPUTS_ENV_MAX else None
        return Described(
            1, False, units + kept, roots, dirs, files, None, obj, files_staged,
            {"CRUCIBLE_INPUTS_FILE": V1_FILE}, text,
        )  # fmt: skip
    if nothing_to_stage(pv, t, reserved):
        # 3.7: no tree; the index it would have held (params {} alone, digested)
        # is never written, so it is not built (most units of a wide run)
        return Described(
            pv.version, True, units + kept, roots, [], [], None, None, files_staged,
            {"CRUCIBLE_INPUTS_DIR": VALUES_DIR},
        )  # fmt: skip
    dirs.append(VALUES_DIR)
    entries = []
    for name in utf16_order(t.model.inputs):
        problem = _input_name_problem(name)
        if problem is not None:
            raise InputRefused(problem, where=in_plan(f"task {task}"))
        entries.append(declared_entry(pv, state, t, key, name, files_staged, files, dirs))
    for name, value in reserved.items():
        entry = reserved_entry(name)
        entry.update(_value_entry(f"inputs/{VALUES_DIR}/{name}", value, files))
        if name == "history" and isinstance(history_meta, dict):
            entry["dropped"] = history_meta["dropped"]  # the budget's oldest-first drop
        if name == "kept" and kept_files:
            entry["files_staged"] = True
            entry["kept_files"] = kept_files
        entries.append(entry)
    index = {"format": INDEX_FORMAT, "task": task, "key": key, "inputs": entries}
    files.append((f"{VALUES_DIR}/{INDEX_NAME}", _index_bytes(index)))
    return Described(
        pv.version, False, units + kept, roots, dirs, files, index, None, files_staged,
        {"CRUCIBLE_INPUTS_DIR": VALUES_DIR},
    )  # fmt: skip


def _v1_object(
    pv: PlanView,
    state: Path,
    t: TaskView,
    key: str | None,
    reserved: dict[str, Any],
    history_meta: Any,
) -> dict[str, Any]:
    """IR v1's one object (3.2): every direct dependency's whole output, then
    the reserved inputs."""
    obj: dict[str, Any] = {}
    for dep in t.needs:
        if dep in RESERVED_INPUTS:
            raise InputRefused(
                f"task {t.name!r} needs a task named {dep!r}, which collides with the "
                f"reserved input of that name in v1 delivery"
            )
        obj[dep] = _v1_dep_value(pv, state, t, dep, producer_key(pv, state, t.name, key, dep))
    obj.update(reserved)
    if isinstance(history_meta, dict):
        obj[V1_HISTORY] = {"dropped": history_meta["dropped"]}
    return obj


# -- records (owned by the packed-records work, crucible.stage._store) ----------


def _instance_records(state: Path, producer: str) -> Mapping[str, dict[str, Any]]:
    """Every instance record of ``producer`` by key, in one read of its packed file."""
    return load_all(state, producer)


# -- end records


def stage_inputs(
    pv: PlanView,
    state: Path,
    task: str,
    workspace: Path,
    *,
    key: str | None = None,
    files_max: int = FILES_RUN_MAX,
    in_place: bool = False,
) -> StagedInputs:
    """Lay down ``workspace/inputs/`` for ``task`` (or one instance of it).

    Described first (:func:`describe_inputs`), then written: by default built in
    a temp directory inside the workspace and renamed into place, so a failure
    leaves the previous ``inputs/`` (or none), never a half-written one. With
    ``in_place`` (a recycled workspace of another unit of the same task: 3.8)
    the tree there is rewritten where it stands instead.
    """
    state = as_path(state)
    workspace = as_path(workspace).absolute()
    inputs_dir = workspace / "inputs"
    check_key(pv, task, key)
    try:  # first, as before the split: a refused staging leaves the workspace, empty
        os.mkdir(workspace)
        new = True  # (a new workspace holds no old tree to drop)
    except FileExistsError:
        new = False
    except FileNotFoundError:
        new = False
        make_dirs(workspace, "workspace")
    except OSError as exc:
        raise OperationalError(
            f"cannot create workspace: {exc.strerror}", where=str(workspace)
        ) from None
    if not new and not workspace.is_dir():
        raise OperationalError("cannot create workspace: File exists", where=str(workspace))
    reserved = None
    if may_stage_nothing(pv, task):  # most units of a wide run: told without describing
        reserved = reserved_values(pv, state, task, key)
        if nothing_to_stage(pv, pv.tasks[task], reserved):  # 3.7: no tree
            if not new:
                drop_old_tree(inputs_dir)
            return _nothing_staged(state, inputs_dir)
    # a unit that stages nothing never gets here (describe_inputs would say d.nothing)
    d = describe_inputs(pv, state, task, key, reserved=reserved)
    files_bytes = None
    if in_place:
        # lazy: stage._restage is not loaded with this module; only stage_inputs() needs it
        from crucible.stage._restage import restage_in_place

        files_bytes = restage_in_place(state, d, inputs_dir, files_max)
    if files_bytes is None:  # fresh (or the recycled tree was not stage's any more)
        files_bytes = _write_fresh(state, d, workspace, inputs_dir, files_max)
    env = {name: str(inputs_dir / rel) for name, rel in d.env_rel.items()}
    if d.v1_text is not None:
        env["CRUCIBLE_INPUTS"] = d.v1_text
    return StagedInputs(
        env=env,
        inputs_dir=inputs_dir,
        values_dir=inputs_dir / VALUES_DIR if d.version >= 2 else None,
        index=d.index,
        inputs_file=inputs_dir / V1_FILE if d.version < 2 else None,
        value=d.value,
        files_bytes=files_bytes,
        files_staged=tuple(sorted(d.files_staged)),
        held=tuple(d.units),
    )


def _write_fresh(state: Path, d: Described, workspace: Path, inputs_dir: Path, bound: int) -> int:
    """The described tree in a new temp directory, renamed over ``inputs/``."""
    try:
        import tempfile  # lazy: tempfile loads shutil, random, bz2 and lzma (~3 ms of start-up)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}inputs-", dir=workspace))
    except OSError as exc:
        raise OperationalError(
            f"cannot create workspace: {exc.strerror}", where=str(workspace)
        ) from None
    try:
        for rel in d.roots:
            (tmp / rel).mkdir()
        files_bytes = stage_units(state, d.units, tmp, 0, bound, holder=workspace)
        for rel in d.dirs:
            (tmp / rel).mkdir()
        tmp_s = str(tmp)
        for rel, data in d.files:
            _write_readonly(f"{tmp_s}/{rel}", data)
        swap_in_dir(tmp, inputs_dir, durable=False)
    except BaseException:
        remove_tree(tmp)
        raise
    return files_bytes


#: str(state) -> str(its empty values directory), once made by this process
_empty_dirs: dict[str, str] = {}


def _nothing_staged(state: Path, inputs_dir: Path) -> StagedInputs:
    empty = _empty_dirs.get(str(state))
    if empty is None:
        empty = str(empty_values_dir(state))
        if state.is_absolute():  # a relative one names another directory after a chdir
            _empty_dirs[str(state)] = empty
    return StagedInputs(
        env={"CRUCIBLE_INPUTS_DIR": empty},
        inputs_dir=inputs_dir,
        values_dir=None,
        index=None,
        inputs_file=None,
        value=None,
        files_bytes=0,
        files_staged=(),
    )


def held_units(pv: PlanView, state: Path, task: str, key: str | None = None) -> list[Unit]:
    """The producer units whose captured files ``task`` is handed (3.4, 3.6)."""
    state = as_path(state)
    units: list[Unit] = []
    for anc in pv.file_ancestors(task):
        units.extend(_ancestor_units(pv, state, task, key, anc))
    reserved = StateLayout(state).reserved_path("kept")
    lv = loop_of(pv)
    if (lv is None or lv.sees_reserved(pv, task)) and reserved.is_file():
        units.extend(kept_units(pv, state, _read_json(reserved)))
    return units


def refresh_inputs(
    pv: PlanView, state: Path, task: str, workspace: Path, *, key: str | None = None,
    units: Sequence[Unit] | None = None,
) -> list[str]:  # fmt: skip
    """Call just before a staged task starts (dispatch stages a unit ahead of
    its start): staged files another consumer changed meanwhile are restored
    and relinked, so the task starts with what was captured (3.4). Returns the
    workspace-relative paths replaced. ``units``: the held units when the
    caller knows them (:attr:`StagedInputs.held`, or :func:`held_units`)."""
    held = _held(pv, state, task, key, units)
    if not held:
        return []
    return refresh_held(as_path(state), held, as_path(workspace).absolute())


def check_inputs(
    pv: PlanView, state: Path, task: str, workspace: Path, *, key: str | None = None,
    units: Sequence[Unit] | None = None,
) -> list[str]:  # fmt: skip
    """Call once the task's processes are gone and before its slot is given back
    (3.4): every staged file it holds must be unchanged. A changed one has its
    published copy restored now, before any other consumer can start, and is
    named in the returned notes (pass them to :func:`capture` as
    ``held_notes``). ``units`` as for :func:`refresh_inputs`."""
    held = _held(pv, state, task, key, units)
    if not held:
        return []
    label = task if key is None else f"{task}[{key}]"
    return verify_consumer(as_path(state), label, held, as_path(workspace).absolute())


def _held(
    pv: PlanView, state: Path, task: str, key: str | None, units: Sequence[Unit] | None
) -> list[Unit]:
    """The units ``task`` (instance ``key``) holds: ``units`` when the caller
    knows them, else found (:func:`held_units`)."""
    check_key(pv, task, key)
    return list(units) if units is not None else held_units(pv, as_path(state), task, key)
