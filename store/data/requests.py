"""The parameter objects of a put and a fetch, as the client builds them and the controller
receives them: :class:`PutOptions` (a new put's placement, groups, tags and keys) and
:class:`FetchRequest` (what a ``get_meta`` asks for and how it waits).

Both travel between processes as plain dicts (codec extensions); ``from_dict`` checks every
field of what a peer sent and raises StoreInputError for a malformed one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayless.store.data.messages import FetchMode
from rayless.store.errors import StoreInputError

__all__ = ["FetchRequest", "PutOptions"]


def _list(value: Any, what: str) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise StoreInputError(f"{what} must be a list or None, got {type(value).__name__}")
    return list(value)


@dataclass(frozen=True)
class PutOptions:
    """A new put's options (see :meth:`~rayless.store.client.store.Store.put`): env ids that
    place its samples, group ids and the partition's group size, per-sample custom metadata
    and KV keys; one entry per sample where given."""

    env_ids: list[str] | None = None
    group_ids: list[Any] | None = None
    custom_meta: list[dict[str, Any]] | None = None
    keys: list[str] | None = None
    group_size: int | None = None

    @classmethod
    def of(
        cls,
        env_ids: Sequence[str] | None = None,
        group_ids: Sequence[Any] | None = None,
        custom_meta: Sequence[Mapping[str, Any]] | None = None,
        keys: Sequence[str] | None = None,
        group_size: int | None = None,
    ) -> PutOptions:
        """The options with every sequence copied into a list (the caller's stay theirs).
        Raises StoreInputError for a field that is not a sequence, or custom metadata that
        is not mappings."""
        metas = _list(custom_meta, "custom_meta")
        if metas is not None and any(not isinstance(c, Mapping) for c in metas):
            raise StoreInputError("custom_meta must hold one mapping per sample")
        return cls(
            _list(env_ids, "env_ids"),
            _list(group_ids, "group_ids"),
            None if metas is None else [dict(c) for c in metas],
            _list(keys, "keys"),
            group_size,
        )

    @property
    def for_new_samples(self) -> bool:
        """Whether any option applies only to new samples (keys, groups)."""
        return self.keys is not None or self.group_size is not None or self.group_ids is not None

    def to_dict(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "env_ids": self.env_ids,
            "group_ids": self.group_ids,
            "custom_meta": self.custom_meta,
            "keys": self.keys,
            "group_size": self.group_size,
        }

    @classmethod
    def from_dict(cls, state: Any) -> PutOptions:
        """Rebuild from :meth:`to_dict`'s form. Raises StoreInputError when it is malformed."""
        if not isinstance(state, Mapping) or set(state) != set(cls.__dataclass_fields__):
            raise StoreInputError(f"malformed PutOptions: {state!r}")
        return cls.of(
            state["env_ids"],
            state["group_ids"],
            state["custom_meta"],
            state["keys"],
            state["group_size"],
        )


@dataclass(frozen=True)
class FetchRequest:
    """One ``get_meta``: ``batch_size`` ready samples of ``partition`` holding ``fields``,
    unconsumed by ``task``, chosen by ``sampler`` (a spec), waiting up to ``timeout`` s (None:
    forever); ``mode`` :attr:`FetchMode.FETCH` marks them consumed, ``PEEK`` does not (its
    string is taken too; another raises StoreInputError). The checks of the other fields are
    the controller's (:meth:`ControllerState.try_fetch`); this only carries them."""

    partition: str
    fields: tuple[str, ...]
    batch_size: int | None = None
    task: str = "default"
    mode: FetchMode = FetchMode.FETCH
    sampler: Any = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        if type(self.mode) is not FetchMode:
            object.__setattr__(self, "mode", FetchMode.of(self.mode))

    def to_dict(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "partition": self.partition,
            "fields": list(self.fields),
            "batch_size": self.batch_size,
            "task": self.task,
            "mode": self.mode.value,
            "sampler": self.sampler,
            "timeout": self.timeout,
        }

    @classmethod
    def from_dict(cls, state: Any) -> FetchRequest:
        """Rebuild from :meth:`to_dict`'s form. Raises StoreInputError when it is malformed."""
        if not isinstance(state, Mapping) or set(state) != set(cls.__dataclass_fields__):
            raise StoreInputError(f"malformed FetchRequest: {state!r}")
        fields = _list(state["fields"], "fields")
        return cls(
            state["partition"],
            tuple(fields or ()),
            state["batch_size"],
            state["task"],
            state["mode"],
            state["sampler"],
            state["timeout"],
        )


def _register_wire() -> None:
    from rayless.transport import register_extension

    register_extension(
        PutOptions, "rayless.store.put_options", PutOptions.to_dict, PutOptions.from_dict
    )
    register_extension(
        FetchRequest, "rayless.store.fetch_request", FetchRequest.to_dict, FetchRequest.from_dict
    )


_register_wire()
