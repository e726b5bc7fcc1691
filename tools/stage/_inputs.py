"""Consumer side: a task's inputs/ tree, its index, its environment.

IR v2 (edition 3): one read-only file per declared input under
``inputs/@values/`` (a directory per fold), reserved inputs under their own
names, and ``index.json``. IR v1 (editions 1–2): one JSON object with every
direct dependency's whole output, in ``inputs/@inputs.json``. Every edition:
each ancestor's captured emits_files under ``inputs/<producer>/``.
Normative text: docs/spec/inputs.md.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from crucible.core import canon, digest
from crucible.core.canon import MAX_SAFE_INTEGER
from crucible.core.contract import RESERVED_INPUTS
from crucible.core.errors import InputRefused, OperationalError, ParseError
from crucible.core.fdio import read_file, write_all
from crucible.core.fsio import remove_tree
from crucible.stage._empty import drop_old_tree, empty_values_dir, nothing_to_stage
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
from crucible.stage._plan import PlanView, TaskView, in_plan, view
from crucible.stage._records import check_key, load_all, load_result
from crucible.stage._share import Unit, refresh_held, stage_units, units_of, verify_consumer

__all__ = [
    "INDEX_FORMAT",
    "INDEX_NAME",
    "INPUTS_ENV_MAX",
    "RESERVED_INPUTS",
    "V1_FILE",
    "VALUES_DIR",
    "StagedInputs",
    "check_inputs",
    "map_items",
    "refresh_inputs",
    "stage_inputs",
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


# -- map items ---------------------------------------------------------------

# (state, task, map) -> (record file identity, items, key -> position). Dispatch
# stages every instance of a 10,000-wide fan-out; re-reading the source record
# (or scanning the items) for each would be O(n²).
_Items = tuple[tuple[int, int, int], list[tuple[str, Any]], dict[str, int]]
_items_cache: dict[tuple[str, str], _Items] = {}


def _items_entry(
    plan: Any, state: Path, task: str
) -> _Items | tuple[None, list[tuple[str, Any]], dict[str, int]]:
    pv = view(plan)
    t = pv.task(task)
    if t.map is None:
        raise InputRefused(f"task {task!r} is not mapped")
    if t.listed:
        return _listed_entry(Path(state), task)
    producer, fld = t.map
    if pv.task(producer).map is not None:
        raise InputRefused(f"task {task!r} maps over {producer!r}, which is itself mapped")
    state = Path(state)
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
    return StateLayout(Path(state)).instances_path(task)


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


def map_items(plan: Any, state: Path, task: str) -> list[tuple[str, Any]]:
    """(raw key, item) of a mapped task, in item order: an array gives "0", "1", …;
    an object gives its keys in canonical JSON order (UTF-16 code units)."""
    return list(_items_entry(plan, state, task)[1])


def instance_item(plan: Any, state: Path, task: str, key: str) -> Any:
    _, items, positions = _items_entry(plan, state, task)
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


def load_params(plan: Any, state: Path) -> dict[str, Any]:
    """``STATE/params.json``; without it, the plan's defaults (every param needs one)."""
    path = StateLayout(state).params_path
    params = _read_json(path, optional=True)
    if params is not _ABSENT:
        if not isinstance(params, dict):
            raise InputRefused("params must be a JSON object", where=str(path))
        return params
    declared = plan.get("workflow", {}).get("params", {}) if isinstance(plan, dict) else {}
    params = {}
    for name, spec in declared.items():
        if not isinstance(spec, dict) or "default" not in spec:
            raise InputRefused(
                f"param {name!r} has no default and {path} does not exist", where=str(path)
            )
        params[name] = spec["default"]
    return params


def _fields(rec: dict[str, Any] | None, t: TaskView, version: int) -> dict[str, Any]:
    output = rec.get("output") if rec else None
    if not isinstance(output, dict):
        return {}
    if version == 1:
        return output
    return {k: v for k, v in output.items() if k not in t.emits}


def build_outcome(plan: Any, state: Path, task: str) -> dict[str, Any]:
    """The epilogue's ``outcome``: every other task's status and note, and its
    fields (v2: the undeclared ones; v1: all), uncapped."""
    pv = view(plan)
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
        if rec and rec.get("tolerated") is True:  # IR v3 (run/control.py)
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
        if loop_of(plan, pv) is not None:  # the scored loop's end (docs/spec/loop.md)
            from crucible.stage._loop_outcome import loop_outcome

            out["loop"] = loop_outcome(state)
        return out
    return {"tasks": tasks}


def reserved_values(plan: Any, state: Path, task: str, key: str | None) -> dict[str, Any]:
    """The reserved inputs that apply to this task, by name, in RESERVED_INPUTS order."""
    pv = view(plan)
    t = pv.task(task)
    layout = StateLayout(state)
    out: dict[str, Any] = {}
    if t.kind in ("command", "evaluate"):  # agents never receive params
        out["params"] = load_params(plan, state)
    if key is not None and revision_of(key) is None:  # a revision of a loop body has no item
        out["item"] = instance_item(plan, state, task, key)
    lv = loop_of(plan, pv)
    if lv is not None and not lv.sees_reserved(pv, task):
        present: set[str] = set()  # before or beside the loop: not its inputs
    else:
        present = _listing(layout)
    for name in RESERVED_STATE_NAMES:
        if f"{name}.json" in present:
            out[name] = _read_json(layout.reserved_path(name))
    if t.epilogue:
        out["outcome"] = build_outcome(plan, state, task)
    return out


def _listing(layout: StateLayout) -> set[str]:
    # One listing instead of a stat per name: most runs have no reserved/ at all.
    try:
        return set(os.listdir(layout.reserved_root))
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
    plan: Any, pv: PlanView, state: Path, task: str, key: str | None, anc: str
) -> list[Unit]:
    """``anc``'s captured units as ``task`` (instance ``key``) is handed them:
    a loop body producer's are those of the revision it reads (3.6)."""
    at = pv.tasks[anc]
    StateLayout(state).files_dir(anc)  # checks the name
    pkey = producer_key(plan, pv, state, task, key, anc)
    if pkey is not None:
        unit = revision_unit(state, anc, pkey, anc)
        return [unit] if unit.store.is_dir() else []
    return units_of(state, anc, at.map is not None)


class _Staging:
    def __init__(
        self, plan: Any, pv: PlanView, state: Path, t: TaskView, key: str | None, tmp: Path
    ) -> None:
        self.plan = plan
        self.pv = pv
        self.state = state
        self.t = t
        self.key = key
        self.tmp = tmp
        self.files_bytes = 0
        self.files_staged: set[str] = set()  # "producer" or "producer/<escaped key>"
        self.kept_files: list[dict[str, Any]] = []

    def pkey(self, producer: str) -> str | None:
        """The instance key at which this task reads unmapped ``producer``."""
        return producer_key(self.plan, self.pv, self.state, self.t.name, self.key, producer)

    def stage_files(self, bound: int) -> None:
        """Every ancestor's captured files under ``inputs/<ancestor>/``, from
        the published copies (3.4): reflinked, hard-linked or copied."""
        for anc in self.pv.ancestors(self.t.name):
            at = self.pv.tasks[anc]
            if not at.emits_files:
                continue
            units = _ancestor_units(self.plan, self.pv, self.state, self.t.name, self.key, anc)
            if at.map is not None and (self.state / "files" / anc).is_dir():
                (self.tmp / anc).mkdir()
            self.files_bytes = stage_units(self.state, units, self.tmp, self.files_bytes, bound)
            self.files_staged.update(u.staged for u in units)

    def stage_kept(self, kept: Any, bound: int) -> None:
        """The kept revision's captured files under ``inputs/@kept/<task>/`` (3.6)."""
        units = kept_units(self.pv, self.state, kept)
        key = revision_key(kept_revision(kept) or 1)
        for u in units:
            before = self.files_bytes
            self.files_bytes = stage_units(self.state, [u], self.tmp, self.files_bytes, bound)
            self.kept_files.append(
                {
                    "producer": u.staged.split("/", 1)[1],
                    "key": key,
                    "path": f"inputs/{u.staged}",
                    "size": self.files_bytes - before,
                }
            )

    def value_entry(self, rel: str, value: Any, path: Path | str) -> dict[str, Any]:
        data = _scalar_bytes(value) or canon.dumps(value)
        _write_readonly(path, data)
        return {
            "value_staged": True,
            "size": len(data),
            "digest": digest.of_bytes(data),
            "path": rel,
        }

    def declared(self, name: str, spec: dict[str, Any], values_dir: Path) -> dict[str, Any]:
        producer, fld = spec["from"].rpartition(".")[::2]
        producer = spec.get("producer", producer)
        fld = spec.get("field", fld)
        if producer not in self.t.needs:
            raise InputRefused(
                f"input {name!r} of task {self.t.name!r} reads {producer!r}, not a direct dependency"
            )
        pt = self.pv.task(producer)
        rec = load_result(self.state, producer, self.pkey(producer) if pt.map is None else None)
        status = _check_join(self.t, producer, rec)
        rel = f"inputs/{VALUES_DIR}/{name}"
        entry: dict[str, Any] = {
            "name": name,
            "kind": "declared",
            "producer": producer,
            "field": fld,
            "type": spec.get("type", pt.emits.get(fld, "any")),
            "status": status,
            "note": rec["note"] if rec else "",
            "fold": pt.map is not None,
        }
        empty = {"value_staged": False, "size": None, "digest": None, "path": None}
        if pt.map is None:
            entry["files_staged"] = producer in self.files_staged
            output = rec.get("output") if rec else None
            if isinstance(output, dict) and fld in output:
                entry.update(self.value_entry(rel, output[fld], values_dir / name))
            elif status == "passed":
                raise InputRefused(
                    f"producer {producer!r} passed without its declared field {fld!r} "
                    f"(plan/state mismatch)",
                    where=str(StateLayout(self.state).result_path(producer)),
                )
            else:
                entry.update(empty)
            return entry
        entry["files_staged"] = any(f.startswith(producer + "/") for f in self.files_staged)
        if rec is None:
            entry.update(empty)
            entry["entries"] = []
            return entry
        fold_dir = values_dir / name
        fold_dir.mkdir()
        entries = []
        total = 0
        # The hot loop of a wide fold: one read of the producer's packed records.
        instances = _instance_records(self.state, producer)
        fold_dir_s = str(fold_dir)
        for k in rec.get("keys", []):
            esc = escape_key(k)
            irec = instances.get(k)
            istatus = irec["status"] if irec else "absent"
            e: dict[str, Any] = {
                "key": k,
                "name": esc,
                "status": istatus,
                "note": irec["note"] if irec else "",
                "files_staged": f"{producer}/{esc}" in self.files_staged,
            }
            output = irec.get("output") if irec else None
            if isinstance(output, dict) and fld in output:
                e.update(self.value_entry(f"{rel}/{esc}", output[fld], f"{fold_dir_s}/{esc}"))
                total += e["size"]
            elif istatus == "passed":
                raise InputRefused(
                    f"instance {k!r} of {producer!r} passed without its declared field {fld!r}"
                )
            else:
                e.update(empty)
            entries.append(e)
        entry.update({"value_staged": True, "size": total, "digest": None, "path": rel})
        entry["entries"] = entries
        return entry


# -- records (owned by the packed-records work, crucible.stage._store) ----------


def _instance_records(state: Path, producer: str) -> dict[str, dict[str, Any]]:
    """Every instance record of ``producer`` by key, in one read of its packed file."""
    return load_all(state, producer)


# -- end records


def stage_inputs(
    plan: Any,
    state: Path,
    task: str,
    workspace: Path,
    *,
    key: str | None = None,
    files_max: int = FILES_RUN_MAX,
) -> StagedInputs:
    """Lay down ``workspace/inputs/`` for ``task`` (or one instance of it).

    Built in a temp directory inside the workspace and renamed into place, so a
    failure leaves the previous ``inputs/`` (or none), never a half-written one.
    """
    pv = view(plan)
    t = pv.task(task)
    check_key(plan, task, key)
    state = Path(state)
    workspace = Path(workspace).absolute()
    inputs_dir = workspace / "inputs"
    reserved: dict[str, Any] | None = None
    if pv.version >= 2 and not t.inputs and t.kind != "agent":
        reserved = reserved_values(plan, state, task, key)
        if nothing_to_stage(pv, t, reserved):  # 3.7: no tree (nothing it would say)
            try:
                workspace.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OperationalError(
                    f"cannot create workspace: {exc.strerror}", where=str(workspace)
                ) from None
            drop_old_tree(inputs_dir)
            return _nothing_staged(state, inputs_dir)
    try:
        workspace.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}inputs-", dir=workspace))
    except OSError as exc:
        raise OperationalError(
            f"cannot create workspace: {exc.strerror}", where=str(workspace)
        ) from None
    try:
        staging = _Staging(plan, pv, state, t, key, tmp)
        staging.stage_files(files_max)
        if reserved is None:
            reserved = reserved_values(plan, state, task, key)
        if "kept" in reserved:
            staging.stage_kept(reserved["kept"], files_max)
        history_meta = read_meta(state).get("history") if "history" in reserved else None
        env: dict[str, str] = {}
        if pv.version >= 2:
            values_dir = tmp / VALUES_DIR
            values_dir.mkdir()
            entries = []
            for name in utf16_order(t.inputs):
                problem = _input_name_problem(name)
                if problem is not None:
                    raise InputRefused(problem, where=in_plan(f"task {task}"))
                entries.append(staging.declared(name, t.inputs[name], values_dir))
            for name, value in reserved.items():
                entry = reserved_entry(name)
                rel = f"inputs/{VALUES_DIR}/{name}"
                entry.update(staging.value_entry(rel, value, values_dir / name))
                if name == "history" and isinstance(history_meta, dict):
                    entry["dropped"] = history_meta["dropped"]  # the budget's oldest-first drop
                if name == "kept" and staging.kept_files:
                    entry["files_staged"] = True
                    entry["kept_files"] = staging.kept_files
                entries.append(entry)
            index = {
                "format": INDEX_FORMAT,
                "task": task,
                "key": key,
                "inputs": entries,
            }
            _write_readonly(values_dir / INDEX_NAME, _index_bytes(index))
            env["CRUCIBLE_INPUTS_DIR"] = str(inputs_dir / VALUES_DIR)
            result_value: dict[str, Any] | None = None
            inputs_file: Path | None = None
        else:
            obj: dict[str, Any] = {}
            for dep in t.needs:
                if dep in RESERVED_INPUTS:
                    raise InputRefused(
                        f"task {task!r} needs a task named {dep!r}, which collides with the "
                        f"reserved input of that name in v1 delivery"
                    )
                obj[dep] = _v1_dep_value(pv, state, t, dep, staging.pkey(dep))
            obj.update(reserved)
            if isinstance(history_meta, dict):
                obj[V1_HISTORY] = {"dropped": history_meta["dropped"]}
            data = canon.dumps(obj)
            _write_readonly(tmp / V1_FILE, data)
            inputs_file = inputs_dir / V1_FILE
            env["CRUCIBLE_INPUTS_FILE"] = str(inputs_file)
            if len(data) <= INPUTS_ENV_MAX:
                env["CRUCIBLE_INPUTS"] = data.decode("utf-8")
            index = None
            result_value = obj
        swap_in_dir(tmp, inputs_dir, durable=False)
    except BaseException:
        remove_tree(tmp)
        raise
    return StagedInputs(
        env=env,
        inputs_dir=inputs_dir,
        values_dir=inputs_dir / VALUES_DIR if pv.version >= 2 else None,
        index=index,
        inputs_file=inputs_file,
        value=result_value,
        files_bytes=staging.files_bytes,
        files_staged=tuple(sorted(staging.files_staged)),
    )


def _nothing_staged(state: Path, inputs_dir: Path) -> StagedInputs:
    return StagedInputs(
        env={"CRUCIBLE_INPUTS_DIR": str(empty_values_dir(state))},
        inputs_dir=inputs_dir,
        values_dir=None,
        index=None,
        inputs_file=None,
        value=None,
        files_bytes=0,
        files_staged=(),
    )


def held_units(plan: Any, state: Path, task: str, key: str | None = None) -> list[Unit]:
    """The producer units whose captured files ``task`` is handed (3.4, 3.6)."""
    pv = view(plan)
    state = Path(state)
    units: list[Unit] = []
    for anc in pv.ancestors(task):
        if pv.tasks[anc].emits_files:
            units.extend(_ancestor_units(plan, pv, state, task, key, anc))
    reserved = StateLayout(state).reserved_path("kept")
    lv = loop_of(plan, pv)
    if (lv is None or lv.sees_reserved(pv, task)) and reserved.is_file():
        units.extend(kept_units(pv, state, _read_json(reserved)))
    return units


def refresh_inputs(
    plan: Any, state: Path, task: str, workspace: Path, *, key: str | None = None
) -> list[str]:
    """Call just before a staged task starts (dispatch stages a unit ahead of
    its start): staged files another consumer changed meanwhile are restored
    and relinked, so the task starts with what was captured (3.4). Returns the
    workspace-relative paths replaced."""
    check_key(plan, task, key)
    units = held_units(plan, Path(state), task, key)
    if not units:
        return []
    return refresh_held(Path(state), units, Path(workspace).absolute())


def check_inputs(
    plan: Any, state: Path, task: str, workspace: Path, *, key: str | None = None
) -> list[str]:
    """Call once the task's processes are gone and before its slot is given back
    (3.4): every staged file it holds must be unchanged. A changed one has its
    published copy restored now, before any other consumer can start, and is
    named in the returned notes (pass them to :func:`capture` as
    ``held_notes``)."""
    check_key(plan, task, key)
    units = held_units(plan, Path(state), task, key)
    if not units:
        return []
    label = task if key is None else f"{task}[{key}]"
    return verify_consumer(Path(state), label, units, Path(workspace).absolute())
