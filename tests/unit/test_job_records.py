"""``rayless.ray.job_submission``'s records and ``rayless job``'s commands, without a
cluster; the jobs themselves: tests/integration/test_job_submission.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from rayless.cli import build_parser
from rayless.ray import _job_supervisor
from rayless.ray.job_submission import DriverInfo, JobDetails, JobStatus, JobType


def test_job_details_take_the_supervisors_record_as_rays_do() -> None:
    details = JobDetails(
        type="SUBMISSION",
        status="RUNNING",
        entrypoint="python train.py",
        driver_info={"id": None, "node_ip_address": "127.0.0.1", "pid": "7"},
    )
    assert details.type is JobType.SUBMISSION and details.status is JobStatus.RUNNING
    assert details.driver_info == DriverInfo(None, "127.0.0.1", "7")
    assert details.message == "Job is currently running."  # Ray's default messages
    assert JobDetails(type="SUBMISSION", status="FAILED", entrypoint="x").message == "Job failed."
    assert [s.is_terminal() for s in JobStatus] == [False, False, True, True, True]
    assert str(JobStatus.STOPPED) == "STOPPED"
    with pytest.raises(ValueError):
        JobDetails(type="SUBMISSION", status="LOST", entrypoint="x")


def test_the_entrypoint_joins_the_cluster_but_is_no_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "RAYLESS_ADDRESS": "tcp://127.0.0.1:5",
        "RAYLESS_ACTOR_ID": "a1",
        "RAYLESS_ACTOR_NAME": "_rayless_jobs/j",
        "RAYLESS_AGENT_ADDRESS": "ipc:///x",
        "RAYLESS_AGENT_PID": "1",
        "RAYLESS_RAY_PACKAGES": "stale",
        "FROM_JOB": "kept",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(_job_supervisor, "cluster_token", lambda: "secret-token")
    sup = _job_supervisor.JobSupervisor(
        "j", "true", {"env_vars": {"FROM_JOB": "kept"}}, "", {}, {}, None, None
    )
    sup._dir = str(tmp_path)
    env = sup._entrypoint_env()
    assert not {k for k in env if k.startswith("RAYLESS_ACTOR") or k.startswith("RAYLESS_AGENT")}
    assert "RAYLESS_RAY_PACKAGES" not in env  # the job has no files of its own
    assert env["RAYLESS_ADDRESS"] == "tcp://127.0.0.1:5" and env["FROM_JOB"] == "kept"
    assert json.loads(env["RAYLESS_RAY_JOB_RUNTIME_ENV"]) == {"env_vars": {"FROM_JOB": "kept"}}
    assert env["RAY_JOB_SUBMISSION_ID"] == "j"
    token = Path(env["RAYLESS_TOKEN_FILE"])
    assert token.read_text() == "secret-token"
    assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
    assert "secret-token" not in env.values()  # a file, never the environment


def _parse(*argv: str) -> object:
    line = ["job", *argv]
    return build_parser(line).parse_args(line)


def test_rays_job_commands_parse() -> None:
    logs = _parse("logs", "-f", "raysubmit_1", "--address", "h:1")
    assert (logs.job_command, logs.job_id, logs.follow, logs.address) == (  # type: ignore[attr-defined]
        "logs",
        "raysubmit_1",
        True,
        "h:1",
    )
    stop = _parse("stop", "--no-wait", "j")
    assert (stop.job_command, stop.no_wait) == ("stop", True)  # type: ignore[attr-defined]
    assert _parse("list").job_command == "list"  # type: ignore[attr-defined]
    submit = _parse("submit", "--no-wait", "--entrypoint-num-gpus", "1", "--", "python", "x.py")
    assert submit.no_wait and submit.entrypoint_num_gpus == 1.0  # type: ignore[attr-defined]
    assert submit.entrypoint == ["--", "python", "x.py"]  # type: ignore[attr-defined]
