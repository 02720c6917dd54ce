"""What the layers above the runtime (the store, weight sync, the demos, verl's worker groups)
may use of it besides the public API in ``rayless.actors``: spawning helpers, blocking faces,
tracing, by-value pickling, how a spawned child joins, a rendezvous port, how a spawn's
``executable`` (Ray's ``py_executable``) is read, torch's thread
settings, the typed-message decorator, the loop sync calls run on, the environment
variables an actor process finds itself in, what a process it starts needs to join its
cluster (the token, a private directory the host's sweep removes once its owner is gone),
a remote error rebuilt as an instance of its original type (for an error that arrived inside
a value), a hook on method results before they are sent, a handle's method by name (also one
named as one of the handle's own attributes), a call's arguments checked against a function's
or a method's parameters, and whether a wait for a call to this same actor would never end.

Code outside ``actors/`` imports the runtime only from ``rayless.actors``,
``rayless.actors.errors`` and this module (``tests/unit/test_layering.py``); everything else
under ``actors/`` may change without notice.
"""

from __future__ import annotations

from rayless.actors.api.actor import (
    current_handle,
    dumps_by_value,
    loads_by_value,
    self_call_blocks,
)
from rayless.actors.api.binding import check_params, params_of, public_methods
from rayless.actors.api.blocking import BlockingFace, call_limit
from rayless.actors.api.child_join import ChildJoin
from rayless.actors.api.cluster import joined_address
from rayless.actors.api.components import cluster_info, slots_of, spawn_all
from rayless.actors.api.handle import method_of
from rayless.actors.api.interpreter import parse_executable
from rayless.actors.api.lifecycle import opener
from rayless.actors.api.packages import Package, pack_module, pack_working_dir
from rayless.actors.api.portal import Portal, home_loop
from rayless.actors.api.remote_errors import materialize
from rayless.actors.api.sync import SyncCluster
from rayless.actors.control.free_ports import free_port
from rayless.actors.control.process_util import pdeathsig_hook
from rayless.actors.core import timeline
from rayless.actors.core.context import (
    ENV_ACTOR_ID,
    ENV_ACTOR_NAME,
    ENV_ADDRESS,
    ENV_GPU_IDS,
    ENV_NODE_ID,
    ENV_NODE_IP,
)
from rayless.actors.core.context import current as current_cluster
from rayless.actors.core.result_hooks import ResultHook, add_result_hook
from rayless.actors.core.threads import apply_torch_threads, torch_threads
from rayless.actors.core.timeline import store_span, traced, weights_span
from rayless.actors.protocol.messages import PackageRef
from rayless.actors.protocol.wire import message
from rayless.transport.owners import mkdtemp as owned_dir


def cluster_token() -> str:
    """The token of the cluster this process belongs to (an actor's, or a driver's that
    started or joined one): what a process it starts needs to join the same cluster.

    Raises:
        ConnectError: this process belongs to no cluster.
    """
    return current_cluster().token


__all__ = [
    "ENV_ACTOR_ID",
    "ENV_ACTOR_NAME",
    "ENV_ADDRESS",
    "ENV_GPU_IDS",
    "ENV_NODE_ID",
    "ENV_NODE_IP",
    "BlockingFace",
    "ChildJoin",
    "Portal",
    "SyncCluster",
    "add_result_hook",
    "apply_torch_threads",
    "call_limit",
    "check_params",
    "cluster_token",
    "cluster_info",
    "current_handle",
    "dumps_by_value",
    "free_port",
    "home_loop",
    "joined_address",
    "loads_by_value",
    "materialize",
    "message",
    "method_of",
    "opener",
    "owned_dir",
    "Package",
    "PackageRef",
    "ResultHook",
    "self_call_blocks",
    "pack_module",
    "params_of",
    "pack_working_dir",
    "pdeathsig_hook",
    "public_methods",
    "parse_executable",
    "slots_of",
    "spawn_all",
    "store_span",
    "timeline",
    "torch_threads",
    "traced",
    "weights_span",
]
