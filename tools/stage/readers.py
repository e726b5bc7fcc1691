"""Stage's own readers, public for ``crucible.run.cache._keyer``, and the
result-record store's API for dispatch (load_all, write_result, remove_result,
remove_results, update_record, amend_record, parse_packed: docs/spec/inputs.md 5).

The keyer computes a unit's cache key from what staging *would* write, before
anything is staged (docs/spec/cache.md, "When a unit is keyed"), so it must read
every value exactly as staging reads it. These names are that contract; the
modules behind them stay private to stage.
"""

from __future__ import annotations

from crucible.stage._inputs import (
    RESERVED_INPUTS,
    VALUES_DIR,
    build_outcome,
    declared_entry,
    instance_item,
    load_params,
    reserved_entry,
    staged_units,
    task_params,
    utf16_order,
)
from crucible.stage._inputs import _check_join as check_join
from crucible.stage._inputs import _input_name_problem as input_name_problem
from crucible.stage._inputs import _read_json as read_json
from crucible.stage._inputs import _scalar_bytes as scalar_bytes
from crucible.stage._inputs import _v1_dep_value as v1_dep_value
from crucible.stage._layout import RESERVED_STATE_NAMES
from crucible.stage._loop import loop_of
from crucible.stage._names import escape_key
from crucible.stage._plan import PlanView, TaskView, build_view
from crucible.stage._records import (
    amend_record,
    check_key,
    load_all,
    load_record_fast,
    load_result,
    remove_result,
    remove_results,
    update_record,
    write_result,
)
from crucible.stage._share import units_of
from crucible.stage._store import TOMBSTONE, parse_packed

__all__ = [
    "RESERVED_INPUTS",
    "RESERVED_STATE_NAMES",
    "TOMBSTONE",
    "VALUES_DIR",
    "PlanView",
    "TaskView",
    "amend_record",
    "build_outcome",
    "build_view",
    "check_join",
    "check_key",
    "declared_entry",
    "escape_key",
    "input_name_problem",
    "instance_item",
    "load_all",
    "load_params",
    "load_record_fast",
    "load_result",
    "loop_of",
    "parse_packed",
    "read_json",
    "remove_result",
    "remove_results",
    "reserved_entry",
    "scalar_bytes",
    "staged_units",
    "task_params",
    "units_of",
    "update_record",
    "utf16_order",
    "v1_dep_value",
    "write_result",
]
