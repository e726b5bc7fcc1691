"""Hypothesis: arbitrary damage to a valid bundle never yields a traceback or an exit outside 0-3."""

from __future__ import annotations

import tempfile
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crucible.core import canon
from crucible.proof.reader import Inability, verify_bundle
from crucible.proof.reader.cli import command
from tests.proof.reader.bundlegen import org_people, rich, write_files

BASES = [org_people().exported(), rich().exported()]


def _apply(files: dict[str, bytes], edits: list[tuple[int, int, int, bytes]]) -> dict[str, bytes]:
    out = dict(files)
    names = sorted(out)
    for which, op, at, data in edits:
        name = names[which % len(names)]
        blob = out[name]
        pos = at % (len(blob) + 1)
        if op == 0:
            out[name] = blob[:pos] + data + blob[pos:]
        elif op == 1:
            out[name] = blob[:pos] + blob[pos + 1 + len(data) :]
        elif op == 2:
            out[name] = blob[:pos] + data + blob[pos + len(data) :]
        elif op == 3:
            del out[name]
            names = sorted(out)
            if not names:
                break
        else:
            out[name + "x"] = data
    return out


edit = st.tuples(
    st.integers(0, 10_000), st.integers(0, 4), st.integers(0, 100_000), st.binary(max_size=8)
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(range(len(BASES))), edits=st.lists(edit, min_size=1, max_size=4))
def test_byte_damage_never_crashes(base: int, edits: list[tuple[int, int, int, bytes]]) -> None:
    files = _apply(BASES[base], edits)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_files(Path(tmp) / "b", files)
        result = CliRunner().invoke(command, [str(root), "--json"], standalone_mode=False)
        if result.exception is not None:
            from crucible.core.errors import OperationalError

            assert isinstance(result.exception, OperationalError), repr(result.exception)
        else:
            assert result.return_value in (0, 1)
            canon.loads(result.stdout_bytes)


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=120, deadline=None)
@given(
    base=st.sampled_from(range(len(BASES))),
    target=st.sampled_from(
        ["admission-proof.json", "execution.json", "workflow.json", "sets/org.json"]
    ),
    pointer=st.lists(st.integers(0, 50), max_size=5),
    value=json_value,
)
def test_structural_damage_never_crashes(
    base: int, target: str, pointer: list[int], value: object
) -> None:
    files = dict(BASES[base])
    doc = canon.loads(files[target])
    node = doc
    for step in pointer:
        if isinstance(node, dict) and node:
            key = sorted(node)[step % len(node)]
            if isinstance(node[key], (dict, list)) and node[key]:
                node = node[key]
                continue
            node[key] = value
            break
        if isinstance(node, list) and node:
            i = step % len(node)
            if isinstance(node[i], (dict, list)) and node[i]:
                node = node[i]
                continue
            node[i] = value
            break
    try:
        files[target] = canon.dumps(doc)
    except canon.CanonError:
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = write_files(Path(tmp) / "b", files)
        try:
            report = verify_bundle(root)
        except Inability:
            return
        assert report.exit_code in (0, 1)
