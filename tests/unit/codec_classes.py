"""Dataclasses and Enums of an importable module, for the codec's tests (a test module's own
classes would travel too, but a fresh interpreter importing this one is the case tested)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass
class Sample:
    prompt: str
    tokens: Any  # a tensor
    reward: float = 0.0
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.length = len(self.prompt)  # not a field: travels as pickle would take it


@dataclass(frozen=True)
class Frozen:
    x: int
    color: Color


@dataclass(slots=True)
class Slotted:
    a: int
    b: tuple[int, ...]


@dataclass
class Batch:
    samples: list[Sample]
    level: Level
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Child(Sample):
    group: int = 0


class NotData:
    pass
