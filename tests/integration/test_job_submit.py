"""``rayless job submit -- CMD``, run as OpenRLHF's and slime's launch scripts run ``ray job
submit``: the entrypoint runs in the job's working_dir with its env_vars, and its actors and
tasks get the job's runtime_env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.drivers import ROOT
from tests.environ import without_rayless

pytestmark = pytest.mark.integration

SCRIPT = """
import os, sys
from rayless import ray

ray.init(num_cpus=2, runtime_env={"env_vars": {"FROM_INIT": "init"}})

@ray.remote
def look():
    import job_helper
    return job_helper.VALUE, os.environ.get("FROM_JOB"), os.environ.get("FROM_INIT"), open(
        "notes.txt"
    ).read()

print("driver", os.getcwd() == sys.argv[1], os.environ.get("FROM_JOB"), sys.argv[2:])
print("task", *ray.get(look.remote()))
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def _submit(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**without_rayless(), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "rayless.cli", "job", "submit", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_job_submit_runs_the_entrypoint_with_the_jobs_runtime_env(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "job_helper.py").write_text("VALUE = 'shipped'\n")
    (project / "notes.txt").write_text("notes")
    (project / "train.py").write_text(SCRIPT)
    entry = [sys.executable, "train.py", str(project), "--lr", "0.1"]
    env_json = '{"working_dir": "project", "env_vars": {"FROM_JOB": "job"}}'
    out = _submit(
        "--address=http://127.0.0.1:8265", f"--runtime-env-json={env_json}", "--", *entry,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        "driver True job ['--lr', '0.1']",
        "task shipped job init notes",
    ]
    failing = '{"working_dir": "project", "env_vars": {"FROM_JOB": "j", "EXIT_WITH": "3"}}'
    out = _submit(f"--runtime-env-json={failing}", "--", *entry, cwd=tmp_path)
    assert out.returncode == 3, out.stderr[-3000:]  # the entrypoint's status
    out = _submit("--no-wait", "--address", "127.0.0.1:1", "--", "true", cwd=tmp_path)
    assert out.returncode == 1 and "a job needs a running cluster" in out.stderr
    out = _submit("--runtime-env-json", '{"pip": ["x"]}', "--", "true", cwd=tmp_path)
    assert out.returncode == 2 and "pip" in out.stderr
    out = _submit(cwd=tmp_path)
    assert out.returncode == 2 and "no entrypoint" in out.stderr
    assert os.path.isdir(project)


VERL_MAIN = """
import json, os
from rayless import ray
from rayless.ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

# verl's get_ppo_ray_runtime_env(): working_dir None unless the job ships one
working_dir = (
    json.loads(os.environ.get(RAY_JOB_CONFIG_JSON_ENV_VAR, "{}"))
    .get("runtime_env", {})
    .get("working_dir", None)
)
runtime_env = {
    "env_vars": {"TOKENIZERS_PARALLELISM": "true"},
    **({"working_dir": None} if working_dir is None else {}),
}
ray.init(runtime_env=runtime_env)

@ray.remote
def look():
    import job_helper
    return job_helper.VALUE, os.environ["TOKENIZERS_PARALLELISM"]

print(working_dir is not None, *ray.get(look.remote()))
"""


def test_verls_trainer_reads_the_jobs_config_and_adds_no_working_dir(tmp_path: Path) -> None:
    # verl's main_ppo under `ray job submit --runtime-env-json='{"working_dir": ...}'`: it
    # reads RAY_JOB_CONFIG_JSON_ENV_VAR, so its ray.init() does not set working_dir again
    project = tmp_path / "project"
    project.mkdir()
    (project / "job_helper.py").write_text("VALUE = 'shipped'\n")
    (project / "main_ppo.py").write_text(VERL_MAIN)
    out = _submit(
        '--runtime-env-json={"working_dir": "project"}', "--metadata-json", '{"k": "v"}',
        "--", sys.executable, "main_ppo.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["True shipped true"]
