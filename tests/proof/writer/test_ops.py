"""The operation log's forms (admission-proof.md §7): one parser per kind, read
through crucible.core.ndjson."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core.errors import InputRefused, OperationalError, ParseError
from crucible.proof.writer._ops import Finish, Group, Root, Select, Stop, iter_operations

AT = "2026-10-17T09:00:00Z"


def test_every_kind_reads(tmp_path: Path) -> None:
    log = tmp_path / "ops.ndjson"
    log.write_text(
        '{"op":"root","execution":"e","rootInstance":"r","case":"case.json"}\n'
        '{"op":"group","reservation":1,"starts":["r"],"cancelled":[]}\n'
        '{"op":"fork","stage":"org","review":{"actor":"a","at":"' + AT + '"},'
        '"selected":[{"instance":"r","output":0}],"childIds":null}\n'
        '{"op":"cancel"}\n'
        '{"op":"finish","files":{}}\n'
    )
    ops = list(iter_operations(log))
    assert [type(o) for o in ops] == [Root, Group, Select, Stop, Finish]
    assert [o.line for o in ops] == [1, 2, 3, 4, 5]
    assert isinstance(ops[2], Select) and ops[2].fork


def test_unknown_op_lists_the_kinds(tmp_path: Path) -> None:
    log = tmp_path / "ops.ndjson"
    log.write_text('{"op":"rooot"}\n')
    with pytest.raises(InputRefused, match=r"ops.ndjson:1: unknown op 'rooot' \(root, select"):
        list(iter_operations(log))
    log.write_text('{"op":["root"]}\n')
    with pytest.raises(InputRefused, match="unknown op"):
        list(iter_operations(log))


def test_bad_line_is_a_parse_error_naming_the_line(tmp_path: Path) -> None:
    log = tmp_path / "ops.ndjson"
    log.write_text('{"op":"cancel"}\n{oops\n')
    with pytest.raises(ParseError) as info:
        list(iter_operations(log))
    assert str(info.value).startswith(f"{log}:2: ")


def test_unreadable_log_is_operational_naming_it(tmp_path: Path) -> None:
    with pytest.raises(OperationalError, match="cannot read operations") as info:
        list(iter_operations(tmp_path))  # a directory: EISDIR at open
    assert info.value.where == str(tmp_path)


def test_form_errors_carry_a_structured_location(tmp_path: Path) -> None:
    log = tmp_path / "ops.ndjson"
    log.write_text('{"op":"cancel"}\n{"op":"retry","instance":"a"}\n')
    with pytest.raises(InputRefused) as info:
        list(iter_operations(log))
    assert (info.value.location.file, info.value.location.line) == (str(log), 2)
