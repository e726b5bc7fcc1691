"""crucible.core.structs behaves as the standard library's dataclasses on the
subset crucible uses: the same class, declared both ways, must agree on
construction, defaults, equality, hashing, repr, frozenness, pickling and
replace (a hypothesis property over generated class shapes)."""

from __future__ import annotations

import dataclasses
import pickle
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import structs

# A field's shape: (kind, compare, repr); kind: "plain" (no default),
# "default" (a default value), "factory" (default_factory=tuple), "noinit"
# (init=False with a default)
_FIELD = st.tuples(
    st.sampled_from(["plain", "default", "factory", "noinit"]), st.booleans(), st.booleans()
)


def _shape_ok(spec: list[tuple[str, bool, bool]]) -> bool:
    seen_default = False
    for kind, _, _ in spec:
        if kind == "plain" and seen_default:
            return False
        seen_default |= kind in ("default", "factory")
    return True


def _declare(module: Any, spec: list[tuple[str, bool, bool]], frozen: bool, slots: bool) -> type:
    namespace: dict[str, Any] = {"__annotations__": {}, "__module__": __name__}
    for i, (kind, compare, shown) in enumerate(spec):
        name = f"f{i}"
        namespace["__annotations__"][name] = "Any"
        if kind == "default":
            namespace[name] = module.field(default=i, compare=compare, repr=shown)
        elif kind == "factory":
            namespace[name] = module.field(default_factory=tuple, compare=compare, repr=shown)
        elif kind == "noinit":
            namespace[name] = module.field(default=-i, init=False, compare=compare, repr=shown)
        elif not compare or not shown:
            namespace[name] = module.field(compare=compare, repr=shown)
    cls = type("Shape", (), namespace)
    cls.__qualname__ = "Shape"
    return module.dataclass(frozen=frozen, slots=slots)(cls)  # type: ignore[no-any-return]


@settings(max_examples=150, deadline=None)
@given(
    spec=st.lists(_FIELD, max_size=6).filter(_shape_ok),
    frozen=st.booleans(),
    slots=st.booleans(),
    values=st.lists(st.one_of(st.integers(), st.text(max_size=3)), min_size=12, max_size=12),
)
def test_same_behaviour_as_the_standard_library(
    spec: list[tuple[str, bool, bool]], frozen: bool, slots: bool, values: list[Any]
) -> None:
    ours = _declare(structs, spec, frozen, slots)
    theirs = _declare(dataclasses, spec, frozen, slots)
    takes = [f"f{i}" for i, (kind, _, _) in enumerate(spec) if kind != "noinit"]
    required = [f"f{i}" for i, (kind, _, _) in enumerate(spec) if kind == "plain"]
    # positional and keyword construction, with the optional ones left out
    args = values[: len(required)]
    a, b = ours(*args), theirs(*args)
    for i in range(len(spec)):
        assert getattr(a, f"f{i}") == getattr(b, f"f{i}")
    assert repr(a) == repr(b)
    kwargs = {name: values[6 + k % 6] for k, name in enumerate(takes)}
    a2, b2 = ours(**kwargs), theirs(**kwargs)
    assert repr(a2) == repr(b2)
    assert (a == a2) == (b == b2)
    assert (a == ours(*args)) is True
    assert a != b  # different classes never compare equal
    assert getattr(ours, "__match_args__") == getattr(theirs, "__match_args__")  # noqa: B009
    assert [f.name for f in structs.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
    if frozen:
        assert hash(a) == hash(ours(*args))
        for name in [f"f{i}" for i in range(len(spec))]:
            with pytest.raises(AttributeError):
                setattr(a, name, 1)
            with pytest.raises(AttributeError):
                setattr(b, name, 1)
    else:
        assert ours.__hash__ is None and theirs.__hash__ is None
        if spec:
            a.f0 = "changed"
            assert a.f0 == "changed"
    assert hasattr(a, "__dict__") == hasattr(b, "__dict__") == (not slots)
    # replace: the fields __init__ takes, changed or kept
    if takes:
        changed = structs.replace(a2, **{takes[0]: "new"})
        expected = dataclasses.replace(b2, **{takes[0]: "new"})
        assert repr(changed) == repr(expected)


@structs.dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@structs.dataclass
class _Base:
    a: int
    kind: ClassVar[str] = "base"


@structs.dataclass
class _Child(_Base):
    b: str = "b"


@structs.dataclass(frozen=True)
class _Posted:
    n: int
    double: int = structs.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "double", self.n * 2)


def test_pickle_round_trips() -> None:
    for value in (_Point(1, 2, ("a",)), _Child(1), _Posted(3)):
        assert pickle.loads(pickle.dumps(value)) == value
    assert pickle.loads(pickle.dumps(_Posted(3))).double == 6


def test_inheritance_class_vars_and_post_init() -> None:
    assert _Child(1) == _Child(1, "b")
    assert [f.name for f in structs.fields(_Child)] == ["a", "b"]
    assert _Child.kind == "base"
    assert _Posted(4).double == 8
    assert _Posted(4) == _Posted(4)
    assert repr(_Posted(4)) == "_Posted(n=4)"
    with pytest.raises(ValueError, match="init=False"):
        structs.replace(_Posted(4), double=1)
    assert structs.replace(_Posted(4), n=5).double == 10


def test_refusals_match() -> None:
    with pytest.raises(TypeError, match="non-default argument"):

        @structs.dataclass
        class _Bad:
            a: int = 1
            b: int  # type: ignore[misc]

    with pytest.raises(ValueError, match="mutable default"):

        @structs.dataclass
        class _Mutable:
            a: list[int] = []  # noqa: RUF012

    with pytest.raises(ValueError, match="both default and default_factory"):
        structs.field(default=1, default_factory=list)
    with pytest.raises(TypeError):
        structs.fields(object())
    with pytest.raises(structs.FrozenInstanceError):
        _Point(1).x = 2  # type: ignore[misc]


def test_no_module_of_tools_uses_the_standard_module() -> None:
    """Every command's start-up defines these classes: a module of tools/ that
    declared one with ``dataclasses`` would pay its per-class cost again
    (orjson imports the module itself, so a check of ``sys.modules`` cannot
    tell)."""
    tools = Path(__file__).resolve().parents[2] / "tools"
    offenders = [
        str(path.relative_to(tools))
        for path in sorted(tools.rglob("*.py"))
        if path.name != "structs.py"
        and re.search(r"^\s*(from dataclasses import|import dataclasses)", path.read_text(), re.M)
    ]
    assert offenders == []


def test_init_is_compiled_at_the_first_instance_and_behaves_the_same() -> None:
    @structs.dataclass(frozen=True, slots=True)
    class _Lazy:
        a: int
        b: str = "b"

    class _Plain(_Lazy):  # not a struct: inherits the lazy __init__
        __slots__ = ()

    placeholder = _Lazy.__init__
    assert placeholder.__qualname__.endswith("_Lazy.__init__")
    # a plain subclass's instance first: the class that owns __init__ gets the compiled one
    assert _Plain(1) == _Plain(1, "b")
    compiled = _Lazy.__init__
    assert compiled is not placeholder and compiled.__qualname__ == placeholder.__qualname__
    assert _Lazy(2, b="c") == _Lazy(2, "c") and _Lazy.__init__ is compiled
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
        _Lazy()  # type: ignore[call-arg]

    @structs.dataclass
    class _Fresh:
        n: int

    with pytest.raises(TypeError, match="unexpected keyword argument 'm'"):
        _Fresh(m=1)  # type: ignore[call-arg]  # the first call's error is the compiled one's
    assert _Fresh(3).n == 3
