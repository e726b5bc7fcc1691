"""Where a unit's files go under STATE (its workspace, output, log and prompt)."""

from __future__ import annotations

from pathlib import Path

from crucible.stage import StateLayout

__all__ = ["UnitPaths"]


class UnitPaths:
    """Where a unit's files go under STATE, as :class:`crucible.stage.StateLayout`
    spells them; their parent directories are created once per process."""

    def __init__(self, state: Path, layout: StateLayout) -> None:
        self.state = state
        self.layout = layout
        self._made_dirs: set[Path] = set()
        self._output_dirs: dict[int, Path] = {}
        self._work_root = layout.work_root

    def _made(self, path: Path) -> Path:
        parent = path.parent
        if parent not in self._made_dirs:
            parent.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(parent)
        return path

    def output(self, name: str, key: str | None, attempt: int) -> Path:
        # ``name`` is a plan task's (the runner looked it up first), checked when
        # the plan's view was built: joined as is
        if key is not None:
            return self._made(self.layout.output_path(name, key, attempt))
        # An unmapped task's: its attempt's directory (as the layout spells it,
        # made once) and one join, instead of the layout's four Path steps.
        where = self._output_dirs.get(attempt)
        if where is None:
            where = self._made(self.layout.output_path(name, None, attempt)).parent
            self._output_dirs[attempt] = where
        return where / (name + ".json")

    def work(self, name: str, key: str | None) -> Path:
        """The unit's workspace, as the layout spells it (an unmapped task's: one
        join onto the cached ``work/``)."""
        if key is not None:
            return self.layout.work_dir(name, key)
        return self._work_root / name

    def log(self, name: str, key: str | None) -> Path:
        return self._made(self.layout.log_path(name, key))

    def prompt(self, name: str, key: str | None) -> Path:
        return self._made(self.layout.prompt_path(name, key))

    def log_path(self, name: str, key: str | None) -> Path:
        """Where the unit's log is (creating nothing)."""
        return self.layout.log_path(name, key)
