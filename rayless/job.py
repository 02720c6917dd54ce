"""``rayless job submit``: Ray's ``ray job submit`` for a driver script on rayless.

OpenRLHF's and slime's launch scripts start their trainers with
``ray job submit --address=... --runtime-env-json='{"working_dir": ..., "env_vars": ...}' --
python3 train.py ...``. The same line with ``rayless`` in place of ``ray`` runs the
entrypoint (a shell command, as Ray's is) here, in the foreground, with the job's
``runtime_env`` applied as Ray's job manager applies it:

* its ``env_vars`` are in the entrypoint's environment;
* the entrypoint runs in its ``working_dir`` (this host's directory itself; actors get copies);
* ``ray.init()`` in the entrypoint takes the whole ``runtime_env`` as the job's (merged with
  ``ray.init(runtime_env=...)``'s per key, ``env_vars`` per variable; the same key in both is
  a ``ValueError``, unless ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` lets ``ray.init``'s win, as in
  Ray), so every actor and task gets it.

``--address`` names a rayless cluster (``host:port``, ``tcp://host:port``) for the
entrypoint's ``ray.init()`` to join; Ray's dashboard address (``http://...:8265``) and none
mean the entrypoint's usual choice (``RAYLESS_ADDRESS`` if set, else an embedded local
cluster). The exit status is the entrypoint's. Ray's ``--no-wait`` is refused (run it in the
background with your shell); the ``--entrypoint-num-*`` reservations, ``--metadata-json`` and
``--submission-id`` are accepted without an effect.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from typing import Any

from rayless.actors.ext import ENV_ADDRESS
from rayless.ray._worker import ENV_JOB_RUNTIME_ENV, parse_runtime_env

__all__ = ["add_arguments", "job_runtime_env", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``job submit``'s options: Ray's names."""
    sub = parser.add_subparsers(dest="job_command", metavar="COMMAND", required=True)
    submit = sub.add_parser("submit", help="run a driver script with a job's runtime_env")
    submit.add_argument("--address", help="the rayless cluster to join (Ray's http:// ignored)")
    submit.add_argument("--runtime-env", metavar="FILE", help="a YAML (or JSON) runtime_env file")
    submit.add_argument("--runtime-env-json", metavar="JSON", help="a runtime_env as JSON")
    submit.add_argument("--working-dir", help="the runtime_env's working_dir")
    submit.add_argument("--submission-id", "--job-id", dest="submission_id")
    submit.add_argument("--metadata-json")
    for what in ("cpus", "gpus", "memory"):
        submit.add_argument(f"--entrypoint-num-{what}", type=float)
    submit.add_argument("--entrypoint-resources")
    submit.add_argument("--no-wait", action="store_true")
    submit.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- the command to run")


def job_runtime_env(args: argparse.Namespace, cwd: str) -> dict[str, Any]:
    """The job's ``runtime_env`` from ``--runtime-env``, ``--runtime-env-json`` and
    ``--working-dir`` (which wins), its paths made absolute from ``cwd``.

    Raises:
        ValueError: a file or JSON that is not a runtime_env (a mapping).
    """
    env: dict[str, Any] = {}
    if args.runtime_env:
        with open(args.runtime_env) as f:
            text = f.read()
        try:
            import yaml
        except ImportError:  # YAML is JSON's superset: a JSON file still reads
            try:
                loaded = json.loads(text)
            except ValueError:
                raise ValueError(
                    f"{args.runtime_env}: reading a YAML file needs PyYAML (pip install pyyaml)"
                ) from None
        else:
            loaded = yaml.safe_load(text)
        env.update(_mapping(loaded, args.runtime_env))
    if args.runtime_env_json:
        env.update(_mapping(json.loads(args.runtime_env_json), "--runtime-env-json"))
    if args.working_dir:
        env["working_dir"] = args.working_dir
    if isinstance(env.get("working_dir"), str) and "://" not in env["working_dir"]:
        env["working_dir"] = os.path.abspath(os.path.join(cwd, env["working_dir"]))
    if isinstance(env.get("py_modules"), list):
        env["py_modules"] = [
            os.path.abspath(os.path.join(cwd, m)) if isinstance(m, str) and "://" not in m else m
            for m in env["py_modules"]
        ]
    return env


def _mapping(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: a runtime_env is a mapping, got {type(value).__name__}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run the entrypoint with the job's runtime_env; its exit status (2: bad arguments)."""
    command = list(args.entrypoint)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("rayless job submit: no entrypoint (put it after --)", file=sys.stderr)
        return 2
    if args.no_wait:
        print(
            "rayless job submit: --no-wait is not supported (the entrypoint runs here, in the "
            "foreground): run the command in the background with your shell instead",
            file=sys.stderr,
        )
        return 2
    try:
        runtime_env = job_runtime_env(args, os.getcwd())
        parse_runtime_env(runtime_env)  # its keys and types, before anything runs
    except (OSError, ValueError) as exc:
        print(f"rayless job submit: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (runtime_env.get("env_vars") or {}).items()})
    env[ENV_JOB_RUNTIME_ENV] = json.dumps(runtime_env)
    address = args.address or ""
    if address and not address.startswith(("http://", "https://")):
        env[ENV_ADDRESS] = address
    cwd = runtime_env.get("working_dir")
    cwd = cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None
    print(f"rayless job submit: running {' '.join(command)!r}", file=sys.stderr)
    # one shell command, as Ray runs its entrypoint; Ctrl-C reaches it through the terminal's
    # process group, and SIGTERM to us is passed on
    proc = subprocess.Popen(" ".join(command), shell=True, env=env, cwd=cwd)
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: proc.send_signal(sig))
    interrupts = 0
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # the entrypoint got it too: wait for it to end,
                interrupts += 1
                if interrupts > 1:  # unless asked twice
                    proc.kill()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code < 0:
        return 128 - code
    return code
