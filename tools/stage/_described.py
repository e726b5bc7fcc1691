"""What a unit's ``inputs/`` tree must hold, found before anything is written
(:func:`crucible.stage._inputs.describe_inputs`); both writers, fresh
(:mod:`crucible.stage._inputs`) and in place (:mod:`crucible.stage._restage`),
read it."""

from __future__ import annotations

from typing import Any

from crucible.core.structs import dataclass
from crucible.stage._share import Unit

__all__ = ["Described"]


@dataclass
class Described:
    """What :func:`describe_inputs` found a unit's ``inputs/`` tree must hold,
    before anything is written: the writers (:func:`stage_inputs`, fresh or in
    place) lay down exactly this, and the cache keyer keys it
    (crucible.run.cache._keyer). Paths are relative to ``inputs/``."""

    version: int
    nothing: bool  # 3.7: no tree at all
    #: ancestors' and the kept revision's captured units (3.4, 3.6), linked in order
    units: list[Unit]
    #: a mapped ancestor's directory, made even when none of its instances has files
    roots: list[str]
    #: directories of values, parents first ("@values", "@values/<fold>")
    dirs: list[str]
    #: files of values, the index (v2) or ``@inputs.json`` (v1): (path, bytes)
    files: list[tuple[str, bytes]]
    index: dict[str, Any] | None
    value: dict[str, Any] | None  # v1's whole object
    files_staged: set[str]  # "producer" or "producer/<escaped key>"
    #: the task's environment variables naming staged paths: path under inputs/
    env_rel: dict[str, str]
    #: v1: ``CRUCIBLE_INPUTS``, the object's text, while it is at most INPUTS_ENV_MAX
    v1_text: str | None = None
