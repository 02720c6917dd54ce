"""``rayless job``: Ray's ``ray job`` commands (``submit``, ``status``, ``logs``, ``stop``,
``list``, ``delete``) for driver scripts on rayless.

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

The exit status is the entrypoint's. ``--no-wait`` (verl's and EasyR1's multi-node lines)
hands the job to a running cluster instead (``rayless.ray.job_submission``: a supervisor actor
runs it there, its working_dir shipped as an actor's), prints its submission id and returns;
``rayless job logs [-f] ID``, ``status ID``, ``stop ID``, ``list`` and ``delete ID`` then
follow it from any shell that can reach the cluster.

``--address`` names a rayless cluster (``host:port``, ``tcp://host:port``); Ray's dashboard
address (``http://...:8265``) and none mean ``RAYLESS_ADDRESS`` (its token in
``RAYLESS_TOKEN_FILE`` or ``RAYLESS_TOKEN``), else, for ``submit`` without ``--no-wait``, an
embedded local cluster of the entrypoint's own, and for the other commands the local cluster
published on this host. ``--entrypoint-num-cpus`` / ``--entrypoint-num-gpus`` reserve the
supervisor's share with ``--no-wait``; ``--metadata-json`` goes into the job's record and, with
its runtime_env, into the entrypoint's RAY_JOB_CONFIG_JSON_ENV_VAR, as Ray's job manager puts
it there; ``--entrypoint-memory`` and ``--entrypoint-resources`` are accepted without effect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

from rayless.actors.ext import ENV_ADDRESS
from rayless.ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR
from rayless.ray._worker import ENV_JOB_RUNTIME_ENV, parse_runtime_env

__all__ = ["add_arguments", "job_runtime_env", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rayless job``'s commands and options: Ray's names."""
    sub = parser.add_subparsers(dest="job_command", metavar="COMMAND", required=True)
    submit = sub.add_parser("submit", help="run a driver script with a job's runtime_env")
    _address(submit)
    submit.add_argument("--runtime-env", metavar="FILE", help="a YAML (or JSON) runtime_env file")
    submit.add_argument("--runtime-env-json", metavar="JSON", help="a runtime_env as JSON")
    submit.add_argument("--working-dir", help="the runtime_env's working_dir")
    submit.add_argument("--submission-id", "--job-id", dest="submission_id")
    submit.add_argument("--metadata-json")
    for what in ("cpus", "gpus"):
        submit.add_argument(f"--entrypoint-num-{what}", type=float)
    submit.add_argument("--entrypoint-memory", type=int)
    submit.add_argument("--entrypoint-resources")
    submit.add_argument(
        "--no-wait", action="store_true", help="hand the job to the cluster and return"
    )
    submit.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- the command to run")
    for name, text in (
        ("status", "a submitted job's status"),
        ("logs", "a submitted job's output"),
        ("stop", "stop a submitted job"),
        ("delete", "forget an ended job: its record and its log"),
    ):
        cmd = sub.add_parser(name, help=text)
        _address(cmd)
        cmd.add_argument("job_id", metavar="JOB_ID", help="the submission id")
        if name == "logs":
            cmd.add_argument(
                "-f", "--follow", action="store_true", help="follow the log until the job ends"
            )
        if name == "stop":
            cmd.add_argument("--no-wait", action="store_true", help="do not wait for the end")
    _address(sub.add_parser("list", help="the cluster's submitted jobs"))


def _address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address", help="the rayless cluster (host:port; Ray's http:// address is ignored)"
    )


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
    """Run the ``job`` command; its exit status (2: bad arguments, 1: no cluster or no
    such job; ``submit`` in the foreground: the entrypoint's)."""
    if args.job_command != "submit":
        return _manage(args)
    command = list(args.entrypoint)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("rayless job submit: no entrypoint (put it after --)", file=sys.stderr)
        return 2
    if args.no_wait:
        return _submit_to_cluster(args, command)
    try:
        runtime_env = job_runtime_env(args, os.getcwd())
        parse_runtime_env(runtime_env)  # its keys and types, before anything runs
    except (OSError, ValueError) as exc:
        print(f"rayless job submit: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (runtime_env.get("env_vars") or {}).items()})
    env[ENV_JOB_RUNTIME_ENV] = json.dumps(runtime_env)
    try:
        metadata = json.loads(args.metadata_json) if args.metadata_json else {}
    except ValueError as exc:
        print(f"rayless job submit: --metadata-json: {exc}", file=sys.stderr)
        return 2
    # the job's config as Ray's job manager gives its entrypoint (verl's trainer reads it)
    env[RAY_JOB_CONFIG_JSON_ENV_VAR] = json.dumps(
        {"runtime_env": runtime_env, "metadata": metadata}
    )
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


def _client(args: argparse.Namespace) -> Any:
    """The cluster's job client.

    Raises:
        ConnectionError: no cluster at the address (or none named or published).
    """
    from rayless.ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(args.address)


def _submit_to_cluster(args: argparse.Namespace, command: list[str]) -> int:
    """``submit --no-wait``: hand the job to the cluster, print its id, return."""
    try:
        runtime_env = job_runtime_env(args, os.getcwd())
        metadata = json.loads(args.metadata_json) if args.metadata_json else None
        client = _client(args)
    except (OSError, ValueError) as exc:  # ConnectionError is an OSError
        print(f"rayless job submit: {exc}", file=sys.stderr)
        if isinstance(exc, ConnectionError):
            print(_NO_CLUSTER, file=sys.stderr)
            return 1
        return 2
    try:
        sid = client.submit_job(
            entrypoint=" ".join(command),
            runtime_env=runtime_env,
            metadata=metadata,
            submission_id=args.submission_id,
            entrypoint_num_cpus=args.entrypoint_num_cpus,
            entrypoint_num_gpus=args.entrypoint_num_gpus,
        )
    except ValueError as exc:
        print(f"rayless job submit: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"rayless job submit: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"Job '{sid}' submitted successfully", file=sys.stderr)
    print(
        f"Query the logs of the job:\n  rayless job logs {sid}\n"
        f"Query the status of the job:\n  rayless job status {sid}\n"
        f"Request the job to be stopped:\n  rayless job stop {sid}",
        file=sys.stderr,
    )
    print(sid)
    return 0


_NO_CLUSTER = (
    "a job needs a running cluster to hold it: start one (rayless launch --token-file F, "
    "which stays up without a driver command) and set RAYLESS_ADDRESS=host:port and "
    "RAYLESS_TOKEN_FILE=F, or pass --address"
)


def _manage(args: argparse.Namespace) -> int:
    """``status``, ``logs``, ``stop``, ``list``, ``delete``."""
    where = f"rayless job {args.job_command}"
    try:
        client = _client(args)
    except ConnectionError as exc:
        print(f"{where}: {exc}\n{_NO_CLUSTER}", file=sys.stderr)
        return 1
    try:
        return _MANAGE[args.job_command](client, args)
    except RuntimeError as exc:
        print(f"{where}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a follow interrupted: the job goes on
        return 130
    finally:
        client.close()


def _status(client: Any, args: argparse.Namespace) -> int:
    info = client.get_job_info(args.job_id)
    print(f"Status for job '{args.job_id}': {info.status}")
    print(f"Status message: {info.message}")
    return 0


def _logs(client: Any, args: argparse.Namespace) -> int:
    if not args.follow:
        sys.stdout.write(client.get_job_logs(args.job_id))
        sys.stdout.flush()
        return 0

    async def follow() -> None:
        async for text in client.tail_job_logs(args.job_id):
            sys.stdout.write(text)
            sys.stdout.flush()

    asyncio.run(follow())
    return 0


def _stop(client: Any, args: argparse.Namespace) -> int:
    print(f"Attempting to stop job '{args.job_id}'", file=sys.stderr)
    if not client.stop_job(args.job_id):
        print(f"Job '{args.job_id}' had already ended: {client.get_job_status(args.job_id)}")
        return 0
    if args.no_wait:
        return 0
    print(f"Waiting for job '{args.job_id}' to exit (disable with --no-wait):", file=sys.stderr)
    while not client.wait_until_ended(args.job_id, 60.0).is_terminal():
        pass  # SIGKILL follows the stop signal after RAY_JOB_STOP_WAIT_TIME_S
    print(f"Job '{args.job_id}' was stopped")
    return 0


def _list(client: Any, args: argparse.Namespace) -> int:
    for info in client.list_jobs():
        print(f"{info.submission_id}\t{info.status}\t{info.entrypoint}")
    return 0


def _delete(client: Any, args: argparse.Namespace) -> int:
    client.delete_job(args.job_id)
    print(f"Job '{args.job_id}' deleted successfully")
    return 0


_MANAGE = {"status": _status, "logs": _logs, "stop": _stop, "list": _list, "delete": _delete}
