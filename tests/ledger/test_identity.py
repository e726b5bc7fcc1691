"""Identity derivation: same content -> same step, different content -> different."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crucible.core.errors import UsageError
from crucible.ledger._identity import (
    command_key,
    content_step,
    parse_key_spec,
    parse_key_specs,
    read_key_files,
)

texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
names = st.from_regex(r"\A[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,8}\Z")
argvs = st.lists(texts, min_size=1, max_size=5)
key_maps = st.dictionaries(names, texts, max_size=4)
digests = st.binary(max_size=8).map(lambda b: "sha256:" + hashlib.sha256(b).hexdigest())
file_maps = st.dictionaries(texts.filter(bool), digests, max_size=3)
triples = st.tuples(argvs, key_maps, file_maps)


def step_of(triple: tuple[list[str], dict[str, str], dict[str, str]]) -> str:
    return content_step("run", command_key(*triple))


@given(triples, triples)
def test_same_content_same_step_different_content_different_step(
    a: tuple[list[str], dict[str, str], dict[str, str]],
    b: tuple[list[str], dict[str, str], dict[str, str]],
) -> None:
    assert (step_of(a) == step_of(b)) == (a == b)


@given(triples)
def test_step_is_deterministic_and_embeds_a_sha256(
    a: tuple[list[str], dict[str, str], dict[str, str]],
) -> None:
    copy = (list(a[0]), dict(a[1]), dict(a[2]))
    step = step_of(a)
    assert step == step_of(copy)
    assert step.startswith("run:sha256:") and len(step) == len("run:sha256:") + 64


@given(key_maps, st.randoms())
def test_key_order_does_not_matter(keys: dict[str, str], rnd: object) -> None:
    specs = [f"{k}={v}" for k, v in keys.items()]
    shuffled = list(specs)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    one = command_key(["cmd"], parse_key_specs(specs), {})
    two = command_key(["cmd"], parse_key_specs(shuffled), {})
    assert content_step("run", one) == content_step("run", two)


@given(argvs)
def test_argv_order_and_splitting_matter(argv: list[str]) -> None:
    joined = [" ".join(argv)]
    if joined != argv:
        assert step_of((argv, {}, {})) != step_of((joined, {}, {}))
    if list(reversed(argv)) != argv:
        assert step_of((argv, {}, {})) != step_of((list(reversed(argv)), {}, {}))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((["a b"], {}, {}), (["a", "b"], {}, {})),
        ((["a", ""], {}, {}), (["a"], {}, {})),
        ((["x"], {"a": "b=c"}, {}), (["x"], {"a=b": "c"}, {})),  # names cannot hold '='
        ((["x"], {"k": "v"}, {}), (["x", "k=v"], {}, {})),  # a key is not an argument
        ((["x"], {"k": "1"}, {}), (["x"], {"k": 1}, {})),  # type: ignore[dict-item]
        ((['a"', "b"], {}, {}), (["a", '"b'], {}, {})),  # quotes are escaped
        ((["a\\", "b"], {}, {}), (["a", "\\b"], {}, {})),
        ((["caf\u00e9"], {}, {}), (["cafe\u0301"], {}, {})),  # no Unicode normalization
        ((["x"], {}, {"f": "sha256:" + "0" * 64}), (["x"], {}, {"g": "sha256:" + "0" * 64})),
        ((["x"], {}, {"f": "sha256:" + "0" * 64}), (["x"], {}, {"f": "sha256:" + "1" * 64})),
        ((["x"], {"k": ""}, {}), (["x"], {}, {})),
    ],
)
def test_edge_cases_stay_distinct(a: tuple, b: tuple) -> None:  # type: ignore[type-arg]
    assert step_of(a) != step_of(b)


def test_key_files_are_keyed_by_content(tmp_path: Path) -> None:
    f = tmp_path / "input.txt"
    f.write_bytes(b"one")
    first = read_key_files([str(f)])
    assert first == {str(f): "sha256:" + hashlib.sha256(b"one").hexdigest()}
    f.write_bytes(b"two")
    second = read_key_files([str(f)])
    assert step_of((["c"], {}, first)) != step_of((["c"], {}, second))
    f.write_bytes(b"one")
    assert read_key_files([str(f)]) == first


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("novalue", "expected NAME=VALUE"),
        ("=v", "NAME must be"),
        ("-a=v", "NAME must be"),
        ("a b=v", "NAME must be"),
        ("a/b=v", "NAME must be"),
    ],
)
def test_bad_key_specs_are_usage_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_key_spec(spec)


def test_key_value_may_contain_equals_and_be_empty() -> None:
    assert parse_key_spec("a=b=c") == ("a", "b=c")
    assert parse_key_spec("a=") == ("a", "")


def test_conflicting_duplicate_key_is_refused_identical_is_fine() -> None:
    assert parse_key_specs(["a=1", "a=1"]) == {"a": "1"}
    with pytest.raises(UsageError, match="twice"):
        parse_key_specs(["a=1", "a=2"])


def test_missing_key_file_and_bad_argv_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_key_files([str(tmp_path / "nope")])
    with pytest.raises(UsageError, match="not a regular file"):
        read_key_files([str(tmp_path)])
    with pytest.raises(UsageError, match="stdin belongs to CMD"):
        read_key_files(["-"])


def test_a_file_named_dash_is_a_key_file_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("-").write_bytes(b"dash")
    assert read_key_files(["./-"]) == {"./-": "sha256:" + hashlib.sha256(b"dash").hexdigest()}
    with pytest.raises(UsageError, match="no command"):
        command_key([], {}, {})
    with pytest.raises(UsageError, match="not valid UTF-8"):
        command_key(["a\udcff"], {}, {})
    with pytest.raises(UsageError, match="step kind"):
        content_step("Bad Kind", {})
