"""``ray._private.runtime_env``: only its ``constants`` (verl's trainer reads a submitted
job's runtime_env through one of them)."""

from rayless.ray._private.runtime_env import constants

__all__ = ["constants"]
