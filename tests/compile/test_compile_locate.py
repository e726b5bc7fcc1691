"""TomlLocator: positions for diagnostics, since tomllib gives none."""

from __future__ import annotations

from crucible.compile._locate import TomlLocator

TEXT = '''# comment: name = "no"
edition = 3

[workflow]
name = "w"   # trailing = comment
description = """
fake = "not a key"
[[workflow.task]]
"""

[workflow.params.who]
type = "string"

[[workflow.task]]
name = "a"
needs = [
  "x",
  "y = z",
]
emits = { one = "string", "two" = "integer" }

[[workflow.task]]
  name = "b"
  workflow.fake = 1
  "quoted key" = 2
  needs = ["a", "zz"]

[workflow.task.emits]
late = "string"
'''


def pos(path: tuple[str | int, ...]) -> tuple[int | None, int | None]:
    loc = TomlLocator("f.toml", TEXT).locate(path)
    return loc.line, loc.col


def test_keys_and_headers() -> None:
    assert pos(("edition",)) == (2, 1)
    assert pos(("workflow",)) == (4, 2)
    assert pos(("workflow", "name")) == (5, 1)
    assert pos(("workflow", "params", "who")) == (11, 2)
    assert pos(("workflow", "params", "who", "type")) == (12, 1)


def test_multiline_strings_and_arrays_are_skipped() -> None:
    # the [[workflow.task]] inside the description string is not a header
    assert pos(("workflow", "task", 0)) == (14, 3)
    assert pos(("workflow", "task", 0, "name")) == (15, 1)
    assert pos(("workflow", "task", 0, "needs")) == (16, 1)
    # elements of a multi-line array of strings are found on their lines
    assert pos(("workflow", "task", 0, "needs", 0)) == (17, 3)
    assert pos(("workflow", "task", 0, "needs", 1)) == (18, 3)
    assert pos(("workflow", "task", 0, "needs", 2)) == (16, 1)  # no such element: the key
    assert pos(("workflow", "task", 0, "emits")) == (20, 1)


def test_inline_table_keys_and_array_elements() -> None:
    assert pos(("workflow", "task", 0, "emits", "one")) == (20, 11)
    assert pos(("workflow", "task", 0, "emits", "two")) == (20, 27)
    assert pos(("workflow", "task", 1, "needs", 1)) == (26, 17)


def test_second_table_indented_dotted_and_quoted_keys() -> None:
    assert pos(("workflow", "task", 1)) == (22, 3)
    assert pos(("workflow", "task", 1, "name")) == (23, 3)
    assert pos(("workflow", "task", 1, "workflow", "fake")) == (24, 3)
    assert pos(("workflow", "task", 1, "quoted key")) == (25, 3)
    # a sub-table header belongs to the latest array entry
    assert pos(("workflow", "task", 1, "emits", "late")) == (29, 1)


def test_unknown_paths_fall_back_to_the_nearest_parent() -> None:
    assert pos(("workflow", "task", 1, "nope", 3)) == (22, 3)
    assert pos(("nothing",)) == (None, None)
    assert TomlLocator("f.toml", TEXT).locate(("nothing",)).where() == "f.toml:$.nothing"


def test_multiline_arrays_with_comments_and_nesting() -> None:
    text = 'a = ["x", # "not an element"\n  "y", "z",  # c\n]\nb = [\n  ["n"],\n  "m",\n]\nc = 1\n'
    loc = TomlLocator("f.toml", text)
    assert (loc.locate(("a", 0)).line, loc.locate(("a", 0)).col) == (1, 6)
    assert (loc.locate(("a", 1)).line, loc.locate(("a", 1)).col) == (2, 3)
    assert (loc.locate(("a", 2)).line, loc.locate(("a", 2)).col) == (2, 8)
    # nested arrays: elements are not guessed, the key is used
    assert (loc.locate(("b", 1)).line, loc.locate(("b", 1)).col) == (4, 1)
    assert (loc.locate(("c",)).line, loc.locate(("c",)).col) == (8, 1)
