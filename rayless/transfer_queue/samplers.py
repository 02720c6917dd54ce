"""TransferQueue's sampler names, as the store's samplers.

``tq.init({"controller": {"sampler": ...}})`` takes a name, a class or an instance of these;
each stands for a sampler of ``rayless.store`` that the controller runs
(:func:`store_spec`): ``SequentialSampler`` takes ready samples in order,
``GRPOGroupNSampler(n_samples_per_prompt)`` whole groups of ``n`` consecutive samples,
``SeqlenBalancedSampler(n_samples_per_prompt, dp_size)`` groups balanced by their
``total_lengths`` custom meta, ``RankAwareSampler`` the first ready samples, one batch per
data-parallel group and step shared by the group's ranks (a fetch with ``sampling_config``'s
``dp_rank`` and ``batch_index``: the controller keeps the batch with that key until the
partition or one of its samples is cleared). TransferQueue's ``BaseSampler`` subclasses
(a ``sample`` method run inside TransferQueue's controller) have no counterpart: write a
store sampler (``rayless.store.controller.samplers``) instead.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BaseSampler",
    "GRPOGroupNSampler",
    "RankAwareSampler",
    "SeqlenBalancedSampler",
    "SequentialSampler",
    "rank_aware",
    "sampler_name",
    "store_spec",
]


class BaseSampler:
    """What TransferQueue's sampler names have in common: :meth:`spec`, the store sampler
    each stands for."""

    def spec(self) -> Any:
        """The ``sampler`` argument of ``Store.get_meta`` this sampler stands for."""
        raise NotImplementedError(
            f"{type(self).__name__} is not one of rayless.transfer_queue's samplers"
        )


class SequentialSampler(BaseSampler):
    """The first ready samples, in order (the default)."""

    def spec(self) -> Any:
        """``"sequential"``."""
        return "sequential"


class GRPOGroupNSampler(BaseSampler):
    """Whole groups of ``n_samples_per_prompt`` consecutive samples (a batch size must be a
    multiple of it). Raises ValueError for ``n_samples_per_prompt`` < 1."""

    def __init__(self, n_samples_per_prompt: int = 1) -> None:
        if n_samples_per_prompt <= 0:
            raise ValueError(f"n_samples_per_prompt must be positive, got {n_samples_per_prompt}")
        self.n_samples_per_prompt = n_samples_per_prompt

    def spec(self) -> Any:
        """The store's grouped sampler of ``n`` samples."""
        return {"name": "grouped", "n": self.n_samples_per_prompt}


class SeqlenBalancedSampler(GRPOGroupNSampler):
    """Groups of ``n_samples_per_prompt`` spread over ``dp_size`` ranks so that each rank's
    total length (the samples' ``total_lengths`` custom meta) is balanced."""

    def __init__(self, n_samples_per_prompt: int = 1, dp_size: int = 1) -> None:
        super().__init__(n_samples_per_prompt)
        if dp_size <= 0:
            raise ValueError(f"dp_size must be positive, got {dp_size}")
        self.dp_size = dp_size

    def spec(self) -> Any:
        """The store's seqlen-balanced sampler."""
        return {"name": "seqlen_balanced", "dp_size": self.dp_size, "n": self.n_samples_per_prompt}


class RankAwareSampler(SequentialSampler):
    """The first ready samples, shared by the ranks of one data-parallel group: every fetch
    with the same ``sampling_config`` ``dp_rank`` and ``batch_index`` (and task and
    partition) gets the same batch; groups get disjoint batches."""


_BY_NAME: dict[str, type[BaseSampler]] = {
    cls.__name__: cls
    for cls in (SequentialSampler, GRPOGroupNSampler, SeqlenBalancedSampler, RankAwareSampler)
}


def rank_aware(sampler: Any) -> bool:
    """Whether ``sampler`` (a name, class or instance, as :func:`store_spec` takes) is
    :class:`RankAwareSampler`."""
    if isinstance(sampler, str):
        return sampler == RankAwareSampler.__name__
    if isinstance(sampler, type):
        return issubclass(sampler, RankAwareSampler)
    return isinstance(sampler, RankAwareSampler)


def sampler_name(sampler: Any) -> str:
    """The name of ``sampler`` (a name, class or instance) as TransferQueue's config shows
    it once read back (``get_config``)."""
    if isinstance(sampler, str):
        return sampler
    return sampler.__name__ if isinstance(sampler, type) else type(sampler).__name__


def store_spec(sampler: Any) -> Any:
    """The store sampler that ``sampler`` (a name, a class or an instance of this module's
    samplers) stands for.

    Raises:
        ValueError: an unknown name, or another kind of sampler (TransferQueue's own
            ``BaseSampler`` subclasses run inside its controller: there is no such code here).
    """
    if isinstance(sampler, str):
        cls = _BY_NAME.get(sampler)
        if cls is None:
            raise ValueError(f"Could not find sampler {sampler}") from None
        return cls().spec()
    if isinstance(sampler, type) and issubclass(sampler, BaseSampler):
        return sampler().spec()
    if isinstance(sampler, BaseSampler) and type(sampler).spec is not BaseSampler.spec:
        return sampler.spec()
    raise ValueError(
        f"sampler {sampler!r} is not one of {sorted(_BY_NAME)}: rayless.transfer_queue runs "
        "the store's samplers (see docs/moving-from-transferqueue.md)"
    )
