"""``ray._private.runtime_env.constants``: the name of the variable that holds a submitted
job's config (``{"runtime_env": ..., "metadata": ...}`` as JSON) in its entrypoint's
environment. ``rayless job submit`` and the job supervisor set it, as Ray's job manager does;
verl's ``get_ppo_ray_runtime_env`` reads it to learn whether the job ships a working_dir."""

RAY_JOB_CONFIG_JSON_ENV_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"

__all__ = ["RAY_JOB_CONFIG_JSON_ENV_VAR"]
