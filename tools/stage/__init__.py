"""crucible.stage: the file contract between a producer task and its consumers.

Every call that reads the plan is a method of :class:`StateDir` (a run's state
directory over one plan, whose view is built once). Consumer side:
:meth:`StateDir.stage_inputs` lays down a task's ``inputs/`` (IR v2: one file
per declared input plus an index; IR v1: one object) and returns its
environment. Producer side: :meth:`StateDir.capture` reads a task's result,
checks and caps its declared fields, captures its emits_files and writes its
settled record. :meth:`StateDir.render_prompt` builds an agent's prompt. The
record calls that need no plan (:func:`load_result`, :func:`write_result`, …)
stay functions of the state directory. Normative text: docs/spec/inputs.md.
"""

from __future__ import annotations

from crucible.core.fsio import clear_path
from crucible.stage._capture import EMIT_CAP_DEFAULT, EMIT_CAP_MAX, emit_cap_problem
from crucible.stage._files import FILES_RUN_MAX
from crucible.stage._guard import enable as guard_views
from crucible.stage._inputs import (
    INDEX_FORMAT,
    INPUTS_ENV_MAX,
    RESERVED_INPUTS,
    StagedInputs,
    instances_path,
)
from crucible.stage._layout import StateLayout
from crucible.stage._loop import KEPT_DIR, META_FORMAT, revision_key, revision_of
from crucible.stage._names import KEY_COMPONENT_MAX, escape_key, unescape_key
from crucible.stage._prompt import (
    HISTORY_BEGIN,
    HISTORY_END,
    INLINE_TOTAL_MAX,
    INLINE_VALUE_MAX,
    PROMPT_ENV_MAX,
)
from crucible.stage._records import (
    RESULT_FORMAT,
    amend_record,
    load_all,
    load_result,
    remove_result,
    remove_results,
    update_record,
    write_result,
    write_result_where,
)
from crucible.stage._statedir import StateDir

__all__ = [
    "EMIT_CAP_DEFAULT",
    "EMIT_CAP_MAX",
    "FILES_RUN_MAX",
    "HISTORY_BEGIN",
    "HISTORY_END",
    "INDEX_FORMAT",
    "INLINE_TOTAL_MAX",
    "INLINE_VALUE_MAX",
    "INPUTS_ENV_MAX",
    "KEPT_DIR",
    "KEY_COMPONENT_MAX",
    "META_FORMAT",
    "PROMPT_ENV_MAX",
    "RESERVED_INPUTS",
    "RESULT_FORMAT",
    "StagedInputs",
    "StateDir",
    "StateLayout",
    "amend_record",
    "clear_path",
    "emit_cap_problem",
    "escape_key",
    "guard_views",
    "instances_path",
    "load_all",
    "load_result",
    "remove_result",
    "remove_results",
    "revision_key",
    "revision_of",
    "unescape_key",
    "update_record",
    "write_result",
    "write_result_where",
]
