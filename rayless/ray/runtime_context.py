"""``ray.get_runtime_context()``: which job, node, actor and GPUs this code runs with."""

from __future__ import annotations

import os
from typing import Any

from rayless.ray import _internals, _worker

__all__ = ["RuntimeContext", "get_runtime_context"]


def gpu_ids() -> list[int]:
    """The GPUs this process may use (ints), as Ray's ``get_gpu_ids``: an actor's or task's
    own (what rayless set CUDA_VISIBLE_DEVICES to, or would have but for
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``); elsewhere ``CUDA_VISIBLE_DEVICES``."""
    visible = os.environ.get(_internals.ENV_GPU_IDS)
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(v) for v in visible.split(",") if v.strip().isdigit()]


class RuntimeContext:
    """What Ray's runtime context tells: ids, namespace, accelerators."""

    def __init__(self, s: _worker.Session) -> None:
        self._session = s

    def get_job_id(self) -> str:
        """The id of the job (the driver's ``ray.init``), as hex."""
        return self._session.job_id

    @property
    def job_id(self) -> str:
        """The job id (Ray's deprecated property)."""
        return self.get_job_id()

    def get_node_id(self) -> str:
        """The rayless node this code runs on (the driver: the first node of its host)."""
        node = os.environ.get(_internals.ENV_NODE_ID)
        if node:
            return node
        s = self._session
        cluster = _worker.run(s, s.cluster())
        nodes = _worker.run(s, cluster.nodes(actors=False))
        return str(nodes[0]["node_id"]) if nodes else ""

    @property
    def node_id(self) -> str:
        """The node id (Ray's deprecated property)."""
        return self.get_node_id()

    def get_actor_id(self) -> str | None:
        """This actor's id; None in the driver and in tasks."""
        if os.environ.get("RAYLESS_RAY_TASK_WORKER"):
            return None
        return os.environ.get(_internals.ENV_ACTOR_ID) or None

    def get_actor_name(self) -> str | None:
        """This actor's name as given to ``.options(name=...)``; None elsewhere."""
        if self.get_actor_id() is None:
            return None
        name = os.environ.get(_internals.ENV_ACTOR_NAME, "")
        ns = self._session.namespace
        if ns is not None and name.startswith(ns + "/"):
            return name[len(ns) + 1 :]
        return name or None

    @property
    def current_actor(self) -> Any:
        """This actor's own handle (to pass to other actors).

        Raises:
            RuntimeError: not in an actor (a driver, a task), as in Ray.
        """
        handle = _internals.current_handle() if self.get_actor_id() is not None else None
        if handle is None:
            raise RuntimeError("This method is only available in an actor.")
        from rayless.ray.actor import from_rayless

        return from_rayless(handle)

    def get_task_id(self) -> str | None:
        """Not tracked per task by rayless.ray: None."""
        return None

    @property
    def namespace(self) -> str:
        """The namespace named actors are created and looked up in."""
        return self._session.effective_namespace

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        """``{"GPU": [ids]}``: :func:`gpu_ids` as strings, as Ray gives them."""
        return {"GPU": [str(i) for i in gpu_ids()]}

    def get_assigned_resources(self) -> dict[str, float]:
        """GPUs and CPUs this actor holds (from its environment)."""
        out: dict[str, float] = {}
        if gpu_ids():
            out["GPU"] = float(len(gpu_ids()))
        cpus = os.environ.get("RAYLESS_CPUS")
        if cpus:
            out["CPU"] = float(cpus)
        return out

    @property
    def gcs_address(self) -> str:
        """The head's address."""
        s = self._session
        return _worker.run(s, s.cluster()).address

    def get(self) -> dict[str, Any]:
        """The context as a dict (Ray's ``get()``)."""
        return {
            "job_id": self.get_job_id(),
            "node_id": self.get_node_id(),
            "namespace": self.namespace,
        }


def get_runtime_context() -> RuntimeContext:
    """The runtime context of this process (a default ``ray.init()`` first if none)."""
    return RuntimeContext(_worker.session())
