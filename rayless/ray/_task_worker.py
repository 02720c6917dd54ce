"""The actor that runs remote functions: one process serves many tasks, one at a time.

The driver's pool (``remote_function.TaskPools``) sends each function once per worker,
pickled with cloudpickle (``actors.ext.dumps_by_value``: with its file's source lines), and
afterwards only its key. A function's exception travels back as
itself (rayless remote errors); a worker that dies is replaced by the pool, and its task
retried. Refs the function returns (itself, or one level inside a list, tuple or dict) are
waited for, as an actor method's are: each travels with its value.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any

from rayless.actors.ext import loads_by_value
from rayless.ray.object_ref import ObjectRef

ENV_TASK_WORKER = "RAYLESS_RAY_TASK_WORKER"


class TaskWorker:
    """Runs remote functions of the Ray layer (its ``run`` method is the task)."""

    def __init__(self) -> None:
        self._functions: dict[str, Any] = {}
        # get_runtime_context().get_actor_id() is None in a task, as in Ray
        os.environ[ENV_TASK_WORKER] = "1"

    def run(self, key: str, code: bytes | None, args: Any, kwargs: Any) -> Any:
        """Run the function ``key`` (unpickled from ``code`` the first time) on the arguments.

        Raises:
            KeyError: ``key`` was never sent with its code.
            Exception: whatever the function raises.
        """
        fn = self._functions.get(key)
        if fn is None:
            if code is None:
                raise KeyError(f"task function {key} was not sent to this worker")
            fn = self._functions[key] = loads_by_value(code)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result) and type(result) is not ObjectRef:  # a coroutine
            result = asyncio.run(_awaited(result))
        return result  # refs in it are waited for by the Ray layer's result hook (object_ref)

    def ping(self) -> str:
        """Whether the worker serves."""
        return "pong"


async def _awaited(aw: Any) -> Any:
    return await aw
