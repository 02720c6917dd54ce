"""``actors.api.binding``: the remote surface of a class and the caller-side argument check."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayless.actors.api.binding import (
    _shape,
    _signature,
    check_arguments,
    check_groups,
    public_methods,
)
from rayless.actors.api.binding import concurrency_group_marker as concurrency_group
from rayless.actors.api.handle import endpoint
from rayless.actors.protocol.messages import MethodInfo

SPECS = [
    "x, y=, /, z=, *args, k, m=, **kw", "", "a", "a, b=", "*args", "**kw", "x, *, k", "a, /, b",
    "x, y=, *, scale=",
]  # fmt: skip
NAMES = ["x", "y", "z", "k", "m", "a", "b", "scale", "q", "args", "kw"]


class Shapes:
    def f(
        self, x: int, y: int = 3, /, z: Any = (1, 2), *args: int, k: int, m: Any = None, **kw: Any
    ) -> None:
        pass

    async def g(self) -> None:
        pass

    @staticmethod
    def s(a: int, b: str = "x,y") -> None:
        pass

    @classmethod
    def c(cls, a: int) -> None:
        pass

    def _private(self) -> None:
        pass

    async def setup(self) -> None:
        pass


def test_every_public_method_with_its_parameters_as_a_caller_passes_them() -> None:
    assert public_methods(Shapes) == {
        "f": MethodInfo(False, "x, y=, /, z=, *args, k, m=, **kw"),
        "g": MethodInfo(True, ""),
        "s": MethodInfo(False, "a, b="),  # a default with a comma stays one parameter
        "c": MethodInfo(False, "a"),
    }


def test_a_class_that_marks_endpoints_exposes_only_them() -> None:
    class Marked(Shapes):
        @endpoint(timeout=2)
        async def h(self, q: int) -> None:
            pass

    assert public_methods(Marked) == {"h": MethodInfo(True, "q", 2.0)}


@pytest.mark.parametrize("spec", SPECS)
def test_the_quick_check_never_passes_a_call_that_does_not_bind(spec: str) -> None:
    sig = _signature(spec)
    for nargs in range(5):
        combos = itertools.chain.from_iterable(itertools.combinations(NAMES, r) for r in range(3))
        for names in combos:
            args, kwargs = tuple(range(nargs)), dict.fromkeys(names, 1)
            try:
                sig.bind(*args, **kwargs)
                binds = True
            except TypeError:
                binds = False
            assert not (_shape(spec).fits(args, kwargs) and not binds), (spec, args, kwargs)
            info = MethodInfo(False, spec)
            if binds:
                check_arguments(info, lambda: "m()", args, kwargs)
            else:
                with pytest.raises(TypeError, match=r"^m\(\): "):
                    check_arguments(info, lambda: "m()", args, kwargs)


@given(st.integers(0, 6), st.lists(st.sampled_from(NAMES), max_size=4, unique=True))
def test_check_agrees_with_python_for_any_call(nargs: int, names: list[str]) -> None:
    for spec in SPECS:
        args, kwargs = tuple(range(nargs)), dict.fromkeys(names, 0)
        try:
            _signature(spec).bind(*args, **kwargs)
        except TypeError:
            with pytest.raises(TypeError):
                check_arguments(MethodInfo(False, spec), lambda: "m()", args, kwargs)
        else:
            check_arguments(MethodInfo(False, spec), lambda: "m()", args, kwargs)


def test_unknown_parameters_are_not_checked() -> None:
    check_arguments(MethodInfo(False, None), lambda: "m()", (1, 2, 3), {"any": 1})
    check_arguments(None, lambda: "m()", (), {})


class _Grouped:
    @concurrency_group("io")
    def read(self) -> int:
        return 1

    @concurrency_group("io")
    async def aread(self) -> int:
        return 1

    @staticmethod
    @concurrency_group("compute")
    def crunch() -> int:
        return 2

    def plain(self) -> int:
        return 3


def test_concurrency_groups_are_read_from_the_methods_and_checked() -> None:
    methods = public_methods(_Grouped)
    assert {n: m.group for n, m in methods.items()} == {
        "read": "io",
        "aread": "io",
        "crunch": "compute",
        "plain": None,
    }
    assert check_groups("_Grouped", methods, {"io": 2, "compute": 1}) == {"io": 2, "compute": 1}
    with pytest.raises(ValueError, match=r"_Grouped\.crunch runs in concurrency group 'compute'"):
        check_groups("_Grouped", methods, {"io": 2})
    for bad in ({"io": 0, "compute": 1}, {"io": True, "compute": 1}, {"io": 1.5, "compute": 1}):
        with pytest.raises(ValueError, match="must allow an int >= 1"):
            check_groups("_Grouped", methods, bad)
    with pytest.raises(ValueError, match="non-empty string"):
        concurrency_group("")
    with pytest.raises(TypeError, match="marks methods"):
        concurrency_group("io")(3)  # type: ignore[type-var]
