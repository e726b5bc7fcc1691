"""Data classes at a fraction of the standard library's start-up cost.

``@dataclass`` and ``field`` here take the subset of :mod:`dataclasses` that
crucible uses (``frozen``, ``slots``, ``eq``, ``repr``; ``default``,
``default_factory``, ``init``, ``repr``, ``compare``; ``__post_init__``) and
give the classes the same behaviour: the same ``__init__`` signature, equality
between instances of the same class over the compared fields, a hash for
frozen ones, ``FrozenInstanceError`` on assignment, ``__slots__``, pickling.

Why not the standard module: every command starts by defining ~60 of these
classes, and ``dataclasses`` generates up to six methods per class by ``exec``
of source text (0.2-0.55 ms a class) and imports ``inspect`` (with ``ast``,
``dis``, ``tokenize``): ~40 ms of a ~220 ms fully cached dispatch
(benchmarks/bench_cache.py). Here only ``__init__`` is generated, in one
``exec``; equality, hashing and ``repr`` are shared functions over an
``operator.attrgetter`` of the fields (C code, as fast as the generated ones).

What differs, on purpose: ``repr`` has no guard against an instance that
contains itself, and a class may not mix these fields with a standard-library
data class base. :func:`replace` and :func:`fields` stand for
``dataclasses.replace`` and ``dataclasses.fields``.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["MISSING", "Field", "FrozenInstanceError", "dataclass", "field", "fields", "replace"]

_T = TypeVar("_T")

#: the fields of a class made here, in ``__init__`` order (bases first)
_FIELDS = "__struct_fields__"


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen instance."""


class Field:
    """One field: its name, default (or factory) and what it takes part in."""

    __slots__ = ("compare", "default", "default_factory", "init", "name", "repr")

    def __init__(
        self,
        default: Any,
        default_factory: Any,
        init: bool,
        repr: bool,
        compare: bool,
    ) -> None:
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r})"


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    init: bool = True,
    repr: bool = True,
    compare: bool = True,
) -> Any:
    """A field with a default (or a factory called per instance), or one that
    ``__init__`` does not take, ``repr`` does not show or equality ignores."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, init, repr, compare)


@overload
@dataclass_transform(field_specifiers=(field,))
def dataclass(cls: type[_T], /) -> type[_T]: ...


@overload
def dataclass(
    *, frozen: bool = False, slots: bool = False, eq: bool = True, repr: bool = True
) -> Callable[[type[_T]], type[_T]]: ...


def dataclass(
    cls: type[_T] | None = None,
    /,
    *,
    frozen: bool = False,
    slots: bool = False,
    eq: bool = True,
    repr: bool = True,
) -> Any:
    """Make ``cls`` a data class (see the module doc)."""

    def wrap(c: type[_T]) -> type[_T]:
        return _process(c, frozen=frozen, slots=slots, eq=eq, with_repr=repr)

    return wrap if cls is None else wrap(cls)


def fields(class_or_instance: Any) -> tuple[Field, ...]:
    """The fields of a data class (or of an instance's class), in order,
    ``init=False`` ones included."""
    try:
        found: tuple[Field, ...] = getattr(class_or_instance, _FIELDS)
    except AttributeError:
        raise TypeError("must be called with a dataclass type or instance") from None
    return found


def replace(obj: _T, /, **changes: Any) -> _T:
    """A new instance of ``obj``'s class: its fields, with ``changes`` (as
    ``dataclasses.replace``: ``__init__`` and ``__post_init__`` run again, and a
    field ``__init__`` does not take cannot be changed)."""
    for f in fields(obj):
        if not f.init:
            if f.name in changes:
                raise ValueError(
                    f"field {f.name} is declared with init=False, it cannot be specified with replace()"
                )
            continue
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)  # type: ignore[no-any-return]


def _is_class_var(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar", "t.ClassVar"))
    return getattr(annotation, "__origin__", None) is not None and repr(annotation).startswith(
        "typing.ClassVar"
    )


def _own_fields(cls: type) -> list[Field]:
    own: list[Field] = []
    # the class's own annotations (not inspect.get_annotations: importing
    # inspect is what this module avoids)
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
        if _is_class_var(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(value, MISSING, True, True, True)
        f.name = name
        if f.default_factory is MISSING and isinstance(f.default, (list, dict, set)):
            raise ValueError(
                f"mutable default {type(f.default)} for field {name} is not allowed: use default_factory"
            )
        own.append(f)
    return own


def _process(cls: type[_T], *, frozen: bool, slots: bool, eq: bool, with_repr: bool) -> type[_T]:
    inherited: dict[str, Field] = {}
    for base in cls.__mro__[-1:0:-1]:
        for f in base.__dict__.get(_FIELDS, ()):
            inherited[f.name] = f
    own = _own_fields(cls)
    by_name = dict(inherited)
    for f in own:
        by_name[f.name] = f
    all_fields = tuple(by_name.values())
    body = cls.__dict__
    # a class attribute holding a default stays (as the standard module
    # leaves it); a field() object does not
    for f in own:
        if isinstance(body.get(f.name), Field):
            if f.default is MISSING or slots:
                delattr(cls, f.name)
            else:
                setattr(cls, f.name, f.default)
        elif slots and f.name in body:
            delattr(cls, f.name)
    if slots:
        cls = _with_slots(cls, [f.name for f in own if f.name not in inherited], frozen)
    setattr(cls, _FIELDS, all_fields)
    _set(cls, "__match_args__", tuple(f.name for f in all_fields if f.init))
    if "__init__" not in cls.__dict__:
        cls.__init__ = _init_fn(cls, all_fields, frozen)  # type: ignore[misc, method-assign]
    compared = tuple(f.name for f in all_fields if f.compare)
    key = _key_of(compared)
    if with_repr:
        _set(cls, "__repr__", _repr_fn(tuple(f.name for f in all_fields if f.repr)))
    if eq:
        _set(cls, "__eq__", _eq_fn(key))
    class_hash = cls.__dict__.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in cls.__dict__))
    if eq and not explicit_hash:
        if frozen:
            cls.__hash__ = _hash_fn(key)  # type: ignore[assignment]
        else:
            cls.__hash__ = None  # type: ignore[assignment]
    if frozen:
        if "__setattr__" in cls.__dict__ or "__delattr__" in cls.__dict__:
            raise TypeError(f"cannot overwrite attribute __setattr__ in class {cls.__name__}")
        names = frozenset(f.name for f in all_fields)
        cls.__setattr__ = _frozen_setattr(cls, names)  # type: ignore[method-assign, assignment]
        cls.__delattr__ = _frozen_delattr(cls, names)  # type: ignore[method-assign, assignment]
    return cls


def _set(cls: type, name: str, value: Any) -> None:
    """Set ``name`` unless the class body defines it (the standard module's rule)."""
    if name not in cls.__dict__:
        setattr(cls, name, value)


def _with_slots(cls: type[_T], names: list[str], frozen: bool) -> type[_T]:
    namespace = dict(cls.__dict__)
    for name in names:
        namespace.pop(name, None)
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = tuple(names)
    qualname = getattr(cls, "__qualname__", None)
    meta: Any = type(cls)
    new: Any = meta(cls.__name__, cls.__bases__, namespace)
    if qualname is not None:
        new.__qualname__ = qualname
    if frozen and "__getstate__" not in namespace:
        # pickle restores slots by setattr, which a frozen class refuses
        new.__getstate__ = _slots_getstate
        new.__setstate__ = _slots_setstate
    made: type[_T] = new
    return made


def _slots_getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in getattr(self, _FIELDS)]


def _slots_setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(getattr(self, _FIELDS), state, strict=True):
        object.__setattr__(self, f.name, value)


def _key_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda self: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda self: (one(self),)
    return attrgetter(*names)


def _eq_fn(key: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented

    return __eq__


def _hash_fn(key: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(key(self))

    return __hash__


def _repr_fn(names: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _frozen_setattr(owner: type, names: frozenset[str]) -> Callable[[Any, str, Any], None]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is owner or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    return __setattr__


def _frozen_delattr(owner: type, names: frozenset[str]) -> Callable[[Any, str], None]:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is owner or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    return __delattr__


class _Factory:
    """The default of a parameter whose field has a default factory."""

    __slots__ = ()


_FACTORY = _Factory()


def _init_fn(cls: type, all_fields: tuple[Field, ...], frozen: bool) -> Callable[..., None]:
    """``__init__`` as the standard module writes it: one assignment per field,
    in one ``exec`` (a loop over the fields would cost each instance ~1 us a
    field)."""
    params: list[str] = []
    lines: list[str] = []
    scope: dict[str, Any] = {"_FACTORY": _FACTORY, "_setattr": object.__setattr__}
    seen_default = False
    for i, f in enumerate(all_fields):
        if f.init:
            if f.default is not MISSING:
                scope[f"_d{i}"] = f.default
                params.append(f"{f.name}=_d{i}")
                seen_default = True
            elif f.default_factory is not MISSING:
                params.append(f"{f.name}=_FACTORY")
                seen_default = True
            elif seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
            else:
                params.append(f.name)
        if f.default_factory is not MISSING:
            scope[f"_f{i}"] = f.default_factory
            value = f"_f{i}() if {f.name} is _FACTORY else {f.name}" if f.init else f"_f{i}()"
        elif f.init:
            value = f.name
        elif f.default is not MISSING:
            scope[f"_d{i}"] = f.default
            value = f"_d{i}"
        else:
            continue  # set by __post_init__ (or never)
        if frozen:
            lines.append(f"  _setattr(self, {f.name!r}, {value})")
        else:
            lines.append(f"  self.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        lines.append("  self.__post_init__()")
    if not lines:
        lines.append("  pass")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines)
    qualname = f"{cls.__qualname__}.__init__"

    def compiled() -> Callable[..., None]:
        # our own text, built from the class's field names
        exec(source, scope)
        init: Callable[..., None] = scope["__init__"]
        init.__qualname__ = qualname
        return init

    # Compiled at the first instance, not with the class: a command defines
    # ~50 of these classes and makes instances of a third of them, and the
    # exec is most of what defining one costs (~5 ms of every start).
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init = compiled()
        if cls.__dict__.get("__init__") is __init__:
            cls.__init__ = init  # type: ignore[misc]
        init(self, *args, **kwargs)

    __init__.__qualname__ = qualname
    return __init__
