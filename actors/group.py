"""Groups of actors spawned together, optionally wired for torch.distributed.

Filled in by the bootstrap work (issue 6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.cluster import Cluster
    from actors.handle import ActorHandle


async def spawn_group(
    cluster: Cluster, cls: type, n: int, *args: Any, **kwargs: Any
) -> list[ActorHandle]:
    """Spawn ``n`` actors of ``cls``; see the module docstring."""
    raise NotImplementedError("spawn_group arrives with the bootstrap issue")
