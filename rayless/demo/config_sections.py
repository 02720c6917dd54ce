"""Typed YAML sections for the demo configs: a dataclass from a mapping, with errors that name
the key (``algo.lr: expected a number, got 'fast'``), and the small value checks both demos
share (:mod:`rayless.demo.config` and :mod:`rayless.demo.grpo_config`)."""

from __future__ import annotations

import dataclasses
import types
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from rayless.placement.resources import parse_index_str

__all__ = ["build_section", "check_choice", "check_positive", "parse_index_string"]

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _check_value(path: str, value: Any, tp: Any) -> Any:
    """``value`` converted to annotation ``tp``, or a ValueError naming ``path``."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for option in get_args(tp):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check_value(path, value, option)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(errors[0] if len(errors) == 1 else f"{path}: invalid value {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{path}: expected a list, got {value!r}")
        (item_tp,) = get_args(tp)
        return [_check_value(f"{path}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build_section(tp, path, value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{path}: expected a string, got {value!r}")
        return value
    raise ValueError(f"{path}: unsupported type {_type_name(tp)}")  # pragma: no cover


def build_section(cls: type[T], path: str, data: Any) -> T:
    """A dataclass ``cls`` from the mapping ``data`` at ``path``: unknown keys, wrong types
    and non-mappings raise ValueError naming the key; omitted keys take the defaults."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping, got {data!r}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(names)})")
    kwargs = {k: _check_value(f"{path}.{k}", v, hints[k]) for k, v in data.items()}
    return cls(**kwargs)


def check_choice(path: str, value: str, options: tuple[str, ...]) -> None:
    """ValueError unless ``value`` is one of ``options``."""
    if value not in options:
        raise ValueError(f"{path}: must be one of {', '.join(options)}, got {value!r}")


def check_positive(path: str, value: float, *, allow_zero: bool = False) -> None:
    """ValueError unless ``value`` > 0 (>= 0 with ``allow_zero``)."""
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{path}: must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def parse_index_string(path: str, value: str) -> list[tuple[int, int]]:
    """``"0-3, 8-11"`` (or ``"5"``; ``"7-4"`` is ``4-7``) as inclusive ``(start, end)`` ranges:
    the planner's own parser (``rayless.placement.parse_index_str``), errors prefixed by
    ``path``."""
    try:
        return parse_index_str(value)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
