"""``rayless stack [NAME]``: every thread's and asyncio task's Python stack of live actors
(Ray's ``ray stack``); see ``actors.api.debugger``."""

from __future__ import annotations

from rayless.actors.api.debugger import add_stack_arguments as add_arguments
from rayless.actors.api.debugger import run_stack as run

__all__ = ["add_arguments", "run"]
