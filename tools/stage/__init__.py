"""crucible.stage: the file contract between a producer task and its consumers.

Consumer side: :func:`stage_inputs` lays down a task's ``inputs/`` (IR v2: one
file per declared input plus an index; IR v1: one object) and returns its
environment. Producer side: :func:`capture` reads a task's result, checks and
caps its declared fields, captures its emits_files and writes its settled
record. :func:`render_prompt` builds an agent's prompt. Normative text:
docs/spec/inputs.md.
"""

from __future__ import annotations

from crucible.stage._capture import EMIT_CAP_DEFAULT, capture
from crucible.stage._files import FILES_RUN_MAX
from crucible.stage._inputs import (
    INDEX_FORMAT,
    INPUTS_ENV_MAX,
    RESERVED_INPUTS,
    StagedInputs,
    map_items,
    stage_inputs,
)
from crucible.stage._layout import StateLayout
from crucible.stage._names import KEY_COMPONENT_MAX, escape_key, unescape_key
from crucible.stage._records import RESULT_FORMAT, load_result, record_settled, settle_fold

__all__ = [
    "EMIT_CAP_DEFAULT",
    "FILES_RUN_MAX",
    "INDEX_FORMAT",
    "INLINE_TOTAL_MAX",
    "INLINE_VALUE_MAX",
    "INPUTS_ENV_MAX",
    "KEY_COMPONENT_MAX",
    "PROMPT_ENV_MAX",
    "RESERVED_INPUTS",
    "RESULT_FORMAT",
    "StagedInputs",
    "StateLayout",
    "capture",
    "escape_key",
    "load_result",
    "map_items",
    "record_settled",
    "settle_fold",
    "stage_inputs",
    "unescape_key",
]

#: An agent stand-in gets CRUCIBLE_PROMPT too while the prompt is at most this.
PROMPT_ENV_MAX = 65536
#: A value is inlined into an agent prompt only when at most this many bytes...
INLINE_VALUE_MAX = 2048
#: ...and the inlined total stays at most this many bytes.
INLINE_TOTAL_MAX = 32768
