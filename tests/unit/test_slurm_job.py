"""``SlurmJob`` against stand-ins of sbatch, squeue, scontrol and scancel (shell scripts on
PATH); tests/integration/test_slurm.py runs it on a real Slurm."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rayless.actors.errors import LaunchError
from rayless.slurm import SlurmJob

# sbatch: job 4242, whose output (-o, %j expanded, in the working directory) says what
# $JOINED says; squeue: the job's state from ./state; scancel: CANCELLED, and says so
TOOLS = {
    "sbatch": """#!/bin/bash
if [ -n "$SBATCH_FAIL" ]; then echo "sbatch: error: $SBATCH_FAIL" >&2; exit 1; fi
while [ $# -gt 1 ]; do
  case "$1" in -o) out="${2//%j/4242}"; shift 2;; *) echo "$1" >> "$LOG/sbatch.args"; shift;; esac
done
cp "$1" "$LOG/job.sbatch"
echo "${JOB_STATE:-RUNNING}" > "$LOG/state"
printf '%s\\n' "$JOINED" > "$out"
echo "4242;test"
""",
    "squeue": '#!/bin/bash\ncat "$LOG/state"\n',
    "scontrol": '#!/bin/bash\necho "NodeName=$3 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=$3"\n',
    "scancel": '#!/bin/bash\necho CANCELLED > "$LOG/state"; echo "$1" >> "$LOG/scancel"\n',
}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in TOOLS.items():
        (bin_dir / name).write_text(text)
        os.chmod(bin_dir / name, 0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(tmp_path),
        "JOINED": "[rayless launch] all 2 nodes joined tcp://gpu01:24242",
    }


def job_in(tmp_path: Path, env: dict[str, str]) -> SlurmJob:
    return SlurmJob(
        nodes=2,
        sbatch_args=["--partition=a100"],
        launch_args=["--gpus", "0,1"],
        python="/opt/py 3/python",
        workdir=tmp_path,
        token_dir=tmp_path / "tokens",
        env=env,
    )


def test_a_job_submits_one_launch_per_node_and_finds_the_head_by_its_node_addr(
    tmp_path: Path, env: dict[str, str]
) -> None:
    job = job_in(tmp_path, env)
    with job:
        assert job.job_id == 4242
        assert job.address == "tcp://10.0.0.7:24242"  # gpu01's NodeAddr
        (private,) = (tmp_path / "tokens").iterdir()
        token = private / "token"
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
        assert token.read_text().strip() == job.token and len(job.token) == 64
        script = (tmp_path / "job.sbatch").read_text()
        assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in script
        assert (
            f"exec srun '/opt/py 3/python' -m rayless.actors.launch.node --token-file {token} "
            "--gpus 0,1\n" in script
        )
        assert job.token not in script
        assert "--partition=a100" in (tmp_path / "sbatch.args").read_text()
    assert (tmp_path / "scancel").read_text() == "4242\n"
    assert list((tmp_path / "tokens").iterdir()) == []  # the token went with the job
    job.cancel()  # idempotent: nothing is cancelled twice
    assert (tmp_path / "scancel").read_text() == "4242\n"


def test_a_job_that_ends_before_its_cluster_is_up_raises_with_its_output(
    tmp_path: Path, env: dict[str, str]
) -> None:
    env = {**env, "JOB_STATE": "FAILED", "JOINED": "srun: error: gpu02: task 1: Exited"}
    failed = "ended before its cluster was up:\nsrun: error: gpu02"
    with pytest.raises(LaunchError, match=failed), job_in(tmp_path, env):
        pass
    assert list((tmp_path / "tokens").iterdir()) == []


def test_sbatch_failing_or_a_bad_size_raise(tmp_path: Path, env: dict[str, str]) -> None:
    env = {**env, "SBATCH_FAIL": "invalid partition specified"}
    with pytest.raises(LaunchError, match=r"sbatch failed .*invalid partition"):
        job_in(tmp_path, env).start()
    assert list((tmp_path / "tokens").iterdir()) == []
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        SlurmJob(nodes=0)
