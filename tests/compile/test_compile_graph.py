"""--graph output with task names full of the renderers' metacharacters (QA)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from crucible.compile import compile_path
from crucible.compile._graph import render

WritePack = Callable[..., Path]

PACK = """
edition = 3
[workflow]
name = "g"
[[workflow.task]]
name = 'a"b#quot;'
run = "true"
emits = { xs = "array" }
[[workflow.task]]
name = 'c -->d (e) {f} |g| <h> &amp; #35;'
needs = ['a"b#quot;']
map = 'a"b#quot;.xs'
run = "true"
"""


def test_mermaid_escapes_hash_so_names_render_literally(write_pack: WritePack) -> None:
    # '#quot;' in a name used to pass through and render as a double quote
    out = render(compile_path(write_pack(PACK)).plan, "mermaid")
    assert 't0["a#quot;b#35;quot;"]' in out
    assert "c --#gt;d (e) {f} |g| #lt;h#gt; #amp;amp; #35;35;[*]" in out
    assert out.count('"') % 2 == 0


def test_dot_quotes_names(write_pack: WritePack) -> None:
    out = render(compile_path(write_pack(PACK)).plan, "dot")
    assert '"a\\"b#quot;" -> "c -->d (e) {f} |g| <h> &amp; #35;"' in out
