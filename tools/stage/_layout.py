"""Where things live in a run's state directory (docs/spec/inputs.md, "State
directory"; docs/spec/run.md, "State directory"): the one spelling of every
path under ``STATE`` that stage and dispatch share."""

from __future__ import annotations

from pathlib import Path
from typing import overload

from crucible.core.structs import dataclass
from crucible.stage._names import check_task_name, escape_key

__all__ = ["RESERVED_STATE_NAMES", "StateLayout"]

#: Reserved inputs an outer loop may leave in ``STATE/reserved/<name>.json``.
RESERVED_STATE_NAMES = ("history", "revision", "kept")


class _In:
    """A fixed path directly under ``STATE``, read as an attribute of a layout."""

    def __init__(self, name: str, doc: str | None = None) -> None:
        self.name = name
        self.__doc__ = f"``{name}``: {doc}" if doc else f"``{name}``"

    @overload
    def __get__(self, layout: None, owner: type[StateLayout]) -> _In: ...
    @overload
    def __get__(self, layout: StateLayout, owner: type[StateLayout]) -> Path: ...
    def __get__(self, layout: StateLayout | None, owner: type[StateLayout]) -> Path | _In:
        if layout is None:
            return self
        return layout.state / self.name


@dataclass(frozen=True)
class StateLayout:
    """Paths inside ``STATE``. Task names are checked and keys escaped, so every
    path returned stays inside ``STATE``."""

    state: Path

    # the fixed paths directly under STATE; the spec's name for one, where it has
    # more than its file name, is its doc
    plan_path = _In("plan.json")
    params_path = _In("params.json")
    session_path = _In("session.jsonl")
    lock_path = _In("lock")
    outputs_path = _In("outputs.json", "IR v3: the run's results (run.md, 'Run results')")
    loop_path = _In("loop.json", "IR v3: the scored loop's revisions (loop.md; schema loop.json)")
    executor_token_path = _In("executor-token", "what every Dask worker must read back (run.md)")
    publish_scratch = _In(
        ".publish", "where --publish-dir builds a destination on STATE's file system (run.md)"
    )
    results_root = _In("results")
    files_root = _In("files")
    work_root = _In("work")
    shared_root = _In("shared")
    reserved_root = _In("reserved")

    def under(self, root: Path, task: str, key: str | None, suffix: str = "") -> Path:
        """``root/<task><suffix>``, or ``root/<task>/<escaped key><suffix>``: how
        every per-unit path is spelled."""
        name = check_task_name(task)
        if key is None:
            return root / (name + suffix)
        return root / name / (escape_key(key) + suffix)

    _under = under

    def output_path(self, task: str, key: str | None, attempt: int) -> Path:
        """``output/<attempt>/<task>[/<escaped key>].json``: one attempt's
        ``CRUCIBLE_OUTPUT``."""
        return self.under(self.state / "output" / str(attempt), task, key, ".json")

    def log_path(self, task: str, key: str | None = None) -> Path:
        """``logs/<task>[/<escaped key>].log``."""
        return self.under(self.state / "logs", task, key, ".log")

    def prompt_path(self, task: str, key: str | None = None) -> Path:
        """``prompts/<task>[/<escaped key>].txt``: an agent's rendered prompt."""
        return self.under(self.state / "prompts", task, key, ".txt")

    def instances_path(self, task: str) -> Path:
        """``instances/<task>.json``: IR v3, a listed fan-out's instances."""
        return self.under(self.state / "instances", task, None, ".json")

    def result_path(self, task: str, key: str | None = None) -> Path:
        """The file holding the record: ``results/<task>.json``, or for a keyed
        unit its task's packed ``results/<task>.jsonl`` (shared by every key: read
        and write it only through crucible.stage's record functions)."""
        if key is None:
            return self._under(self.results_root, task, None, ".json")
        return self.packed_path(task)

    def packed_path(self, task: str) -> Path:
        """``results/<task>.jsonl``: the records of the task's keyed units."""
        return self._under(self.results_root, task, None, ".jsonl")

    def files_dir(self, task: str, key: str | None = None) -> Path:
        """``files/<task>``, or ``files/<task>/<escaped key>``."""
        return self._under(self.files_root, task, key)

    def work_dir(self, task: str, key: str | None = None) -> Path:
        """``work/<task>``, or ``work/<task>/<escaped key>``."""
        return self._under(self.work_root, task, key)

    def shared_dir(self, task: str, key: str | None = None) -> Path:
        """``shared/<task>``, or ``shared/<task>/<escaped key>``: a unit's published
        copy (inputs.md 3.4)."""
        return self._under(self.shared_root, task, key)

    def reserved_path(self, name: str) -> Path:
        if name not in RESERVED_STATE_NAMES:
            raise ValueError(f"{name!r} is not a reserved state input")
        return self.reserved_root / f"{name}.json"
