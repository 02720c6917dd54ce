"""``ray.runtime_env``: ``RuntimeEnv``, the typed spelling of a ``runtime_env`` dict
(AReaL's schedulers pass ``runtime_env=RuntimeEnv(env_vars=env)``).

A ``RuntimeEnv`` is a dict, as Ray's is: every option that takes ``runtime_env=`` takes one,
and it is checked where it is used, as a plain dict is (``env_vars`` and ``py_executable``
are supported; another field is a ``ValueError`` naming it then). ``RuntimeEnvConfig`` is
accepted and has no effect.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RuntimeEnv", "RuntimeEnvConfig"]


class RuntimeEnvConfig(dict[str, Any]):
    """Ray's setup options of a runtime environment (``setup_timeout_seconds``,
    ``eager_install``): rayless sets nothing up, so they have no effect."""

    def __init__(
        self, setup_timeout_seconds: int = 600, eager_install: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(
            setup_timeout_seconds=setup_timeout_seconds, eager_install=eager_install, **kwargs
        )


class RuntimeEnv(dict[str, Any]):
    """A runtime environment: the fields given (those not None), as a dict.

    Raises:
        TypeError: ``env_vars`` is not a dict of str to str (Ray's check).
    """

    def __init__(
        self,
        *,
        py_modules: list[str] | None = None,
        py_executable: str | None = None,
        working_dir: str | None = None,
        pip: list[str] | None = None,
        conda: dict[str, str] | str | None = None,
        container: dict[str, str] | None = None,
        env_vars: dict[str, str] | None = None,
        worker_process_setup_hook: Any = None,
        nsight: dict[str, str] | str | None = None,
        config: dict[str, Any] | RuntimeEnvConfig | None = None,
        _validate: bool = True,
        **kwargs: Any,
    ) -> None:
        fields = {
            "py_modules": py_modules,
            "py_executable": py_executable,
            "working_dir": working_dir,
            "pip": pip,
            "conda": conda,
            "container": container,
            "env_vars": env_vars,
            "worker_process_setup_hook": worker_process_setup_hook,
            "nsight": nsight,
            **kwargs,
        }
        super().__init__({k: v for k, v in fields.items() if v is not None})
        if env_vars is not None:
            if not isinstance(env_vars, dict):
                raise TypeError(
                    f"runtime_env['env_vars'] must be of type Dict[str, str], got "
                    f"{type(env_vars).__name__}"
                )
            for k, v in env_vars.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    raise TypeError(
                        "runtime_env['env_vars'] must be of type Dict[str, str], but "
                        f"{k!r}: {v!r} is not"
                    )

    def env_vars(self) -> dict[str, str]:
        """The environment variables it sets (a copy; ``{}`` for none)."""
        return dict(self.get("env_vars") or {})

    def to_dict(self) -> dict[str, Any]:
        """Its fields as a plain dict."""
        return dict(self)
