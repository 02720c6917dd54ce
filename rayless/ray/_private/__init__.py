"""``ray._private``: the few of Ray's private functions RL trainers call as if public
(verl's ``ResourcePoolManager`` checks GPUs with
``ray._private.state.available_resources_per_node()``; OpenRLHF takes its master address from
``ray._private.services.get_node_ip_address()``; verl's trainer reads a submitted job's
config through ``ray._private.runtime_env.constants.RAY_JOB_CONFIG_JSON_ENV_VAR``)."""

from rayless.ray._private import runtime_env, services, state

__all__ = ["runtime_env", "services", "state"]
