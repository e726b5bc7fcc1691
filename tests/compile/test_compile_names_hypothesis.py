"""Property tests for task-name validation: valid names stay one path component."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.compile import ValidationFailed, compile_path, load_plan_bytes
from crucible.compile._editions import RESERVED_INPUTS
from crucible.compile._names import task_name_problems

names = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="./\\@[]ab\x00\n-", max_size=8),
    st.sampled_from(["", ".", "..", "...", "@x", "a/b", "a\\b", "x[1]", *RESERVED_INPUTS]),
)


@given(names)
def test_valid_names_are_one_component_inside_the_base(name: str) -> None:
    if task_name_problems(name):
        return
    joined = os.path.normpath(os.path.join("/base/inputs", name))
    assert os.path.dirname(joined) == "/base/inputs"
    assert os.path.basename(joined) == name
    assert not name.startswith("@") and name not in RESERVED_INPUTS


@given(names)
def test_each_unsafe_feature_has_its_code(name: str) -> None:
    codes = {code for code, _ in task_name_problems(name)}
    assert ("name-separator" in codes) == ("/" in name or "\\" in name)
    assert ("name-reserved-prefix" in codes) == name.startswith("@")
    assert ("name-bracketed" in codes) == ("[" in name or "]" in name)
    assert ("name-dot" in codes) == (name in (".", ".."))
    assert ("name-empty" in codes) == (name == "")
    assert ("name-reserved-input" in codes) == (name in RESERVED_INPUTS)
    assert ("name-control" in codes) == any(ord(c) < 0x20 or c == "\x7f" for c in name)


def toml_string(text: str) -> str:
    # JSON escapes are TOML basic-string escapes; TOML also wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


@settings(max_examples=60, deadline=None)
@given(names)
def test_compile_accepts_exactly_the_valid_names(name: str) -> None:
    text = (
        f'[workflow]\nname = "w"\n\n[[workflow.task]]\nname = {toml_string(name)}\nrun = "true"\n'
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pack.toml"
        path.write_text(text, encoding="utf-8")
        problems = task_name_problems(name)
        if problems:
            with pytest.raises(ValidationFailed) as info:
                compile_path(path)
            assert [d.code for d in info.value.diagnostics] == [code for code, _ in problems]
            assert all(d.location.line == 5 for d in info.value.diagnostics)
        else:
            compiled = compile_path(path)
            assert compiled.plan["tasks"][0]["name"] == name
            assert load_plan_bytes(compiled.data, "plan.json").digest == compiled.digest
