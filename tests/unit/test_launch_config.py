"""Launch configuration without processes: env defaults, SLURM hostlists, tokens, ssh commands."""

from __future__ import annotations

import argparse
import shlex
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from rayless.actors.launch import node as launch
from rayless.actors.launch import ssh as ssh_launch
from rayless.actors.launch.node import LaunchError
from rayless.actors.launch.procs import StopFlag


def parse(*argv: str, env: dict[str, str] | None = None) -> launch.LaunchConfig:
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    return launch.config_from_args(parser.parse_args(list(argv)), env or {})


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("gpu07", "gpu07"),
        ("gpu[07-09,12],cpu1", "gpu07"),
        ("a1,b[1-2]", "a1"),
        ("rack[3-4]-n[001-004]", "rack3-n001"),
        ("node[1,3]", "node1"),
    ],
)
def test_first_slurm_host(nodelist: str, first: str) -> None:
    assert launch.first_slurm_host(nodelist) == first


@pytest.mark.parametrize("bad", ["", "gpu[1-2", "gpu]1["])
def test_bad_slurm_hostlists_raise(bad: str) -> None:
    with pytest.raises(LaunchError):
        launch.first_slurm_host(bad)


def test_slurm_defaults_and_torchrun_precedence() -> None:
    slurm = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[10-13]"}
    cfg = parse("--", "train.py", "--lr", "1e-4", env=slurm)
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (4, 2, "gpu10", 29400)
    assert cfg.command == ["train.py", "--lr", "1e-4"]
    assert cfg.address == "tcp://gpu10:29400"
    torchrun = {**slurm, "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "5"}
    cfg = parse(env=torchrun)
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (2, 1, "m", 5)
    cfg = parse("--nnodes", "3", "--node-rank", "0", "--master-addr", "x", env=torchrun)
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr) == (3, 0, "x")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "m"], {}, "node-rank"),
        (["--nnodes", "2"], {}, "master-addr"),
        (["--master-port", "70000"], {}, "master-port"),
        (["--rdzv-timeout", "0"], {}, "rdzv-timeout"),
        ([], {"NNODES": "two"}, "not an integer"),
    ],
)
def test_bad_settings_raise(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        parse(*argv, env=env)


def test_a_missing_token_file_is_created_0600_by_rank0(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "token"
    cfg = parse("--token-file", str(path))
    token = launch.resolve_token(cfg, StopFlag(), {})
    assert path.read_text().strip() == token and len(token) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert launch.resolve_token(cfg, StopFlag(), {}) == token  # then it is reused


def test_other_ranks_wait_for_the_token_file(tmp_path: Path) -> None:
    cfg = parse("--nnodes", "2", "--node-rank", "1", "--master-addr", "m")
    cfg.token_file, cfg.rdzv_timeout = str(tmp_path / "absent"), 0.3
    with pytest.raises(LaunchError, match="did not appear"):
        launch.resolve_token(cfg, StopFlag(), {})
    with pytest.raises(LaunchError, match="needs a shared token"):
        launch.resolve_token(parse("--nnodes", "2", "--master-addr", "m"), StopFlag(), {})
    cfg.token_file = None
    assert launch.resolve_token(cfg, StopFlag(), {"RAYLESS_TOKEN": "abc"}) == "abc"


def test_head_bind_address() -> None:
    assert launch.head_bind_address("127.0.0.1", 5) == "tcp://127.0.0.1:5"
    assert launch.head_bind_address("10.1.2.3", 5) == "tcp://10.1.2.3:5"
    assert launch.head_bind_address("localhost", 5) == "tcp://0.0.0.0:5"
    assert launch.head_bind_address("no-such-host.invalid", 5) == "tcp://0.0.0.0:5"


def test_hostfiles_and_node_ids() -> None:
    hosts = ssh_launch.parse_hosts("# cluster\nu@gpu1 slots=4\n\ngpu2  # spare\ngpu1\n")
    assert hosts == [
        ssh_launch.Host("u@gpu1", 4),
        ssh_launch.Host("gpu2"),
        ssh_launch.Host("gpu1"),
    ]
    assert ssh_launch.node_ids(hosts) == ["gpu1-0", "gpu2", "gpu1-2"]
    assert ssh_launch.parse_hosts("a, b", comma=True) == [
        ssh_launch.Host("a"),
        ssh_launch.Host("b"),
    ]
    with pytest.raises(LaunchError, match="slots"):
        ssh_launch.parse_hosts("a slots=x")
    with pytest.raises(LaunchError, match="no hosts"):
        ssh_launch.parse_hosts(" , ", comma=True)


def test_remote_command_carries_no_token_and_quotes_the_driver() -> None:
    parser = argparse.ArgumentParser()
    ssh_launch.add_arguments(parser)
    args = parser.parse_args(
        ["--hosts", "10.0.0.1,b", "--workdir", "/w d", "--python", "py", "--", "t.py", "a b"]
    )
    hosts = ssh_launch.parse_hosts(args.hosts, comma=True)
    cmd = ssh_launch.remote_command(args, hosts, 1)
    words = shlex.split(cmd)
    assert words[:3] == ["cd", "/w d", "&&"]
    launch_args = words[words.index("py") :]
    assert launch_args[launch_args.index("--node-rank") + 1] == "1"
    assert launch_args[launch_args.index("--master-addr") + 1] == "10.0.0.1"
    assert "--token-stdin" in launch_args and "--node-ip" not in launch_args  # b is a name
    assert launch_args[-3:] == ["--", "t.py", "a b"]
    rank0 = shlex.split(ssh_launch.remote_command(args, hosts, 0))
    assert rank0[rank0.index("--node-ip") + 1] == "10.0.0.1"
    assert "--allow-pickle" not in rank0
    args.allow_pickle = True  # the cluster-wide pickle opt-in reaches every rank
    assert "--allow-pickle" in shlex.split(ssh_launch.remote_command(args, hosts, 1))


STEP = {  # what srun sets in a task of `srun -N2 --ntasks-per-node=1` (Slurm 22.05)
    "SLURM_JOB_ID": "12345",
    "SLURM_JOB_NODELIST": "gpu[01-04,07]",
    "SLURM_NNODES": "5",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "gpu[03-04]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURMD_NODENAME": "gpu04",
}


def test_an_srun_step_gives_rank_size_master_node_id_and_a_job_port() -> None:
    cfg = parse(env=STEP)
    # the step's tasks, not the job's nodes; the step's first host, not the job's
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr) == (2, 1, "gpu03")
    assert cfg.master_port == 20000 + 12345 % 10000
    assert (cfg.node_id, cfg.default_node_id) == (None, "gpu04")
    assert parse("--master-port", "29400", env=STEP).master_port == 29400
    assert parse(env={**STEP, "MASTER_PORT": "5"}).master_port == 5
    assert parse("--node-id", "mine", env=STEP).node_id == "mine"
    assert parse(env={**STEP, "RAYLESS_NODE_ID": "env"}).node_id == "env"


def test_several_tasks_per_node_rank_by_procid() -> None:
    env = {**STEP, "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    cfg = parse(env=env)
    assert (cfg.nnodes, cfg.node_rank, cfg.default_node_id) == (4, 3, "gpu04-1")


def test_outside_a_step_the_job_variables_count() -> None:
    batch = {k: v for k, v in STEP.items() if not k.startswith(("SLURM_STEP", "SLURMD"))}
    cfg = parse(env=batch)
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr) == (5, 1, "gpu01")
    assert cfg.default_node_id is None


def test_two_jobs_get_two_ports() -> None:
    ports = {parse(env={**STEP, "SLURM_JOB_ID": str(j)}).master_port for j in (7, 8)}
    assert ports == {20007, 20008}


def test_node_ids_are_claimed_per_host() -> None:
    cfg = parse("--node-rank", "0", "--nnodes", "2", "--master-addr", "m", env={})
    first, held = launch.claim_node_id(cfg)
    try:
        second, held2 = launch.claim_node_id(replace(cfg, node_rank=1))
        held2.close()
        assert second == f"{first}-r1"
        with pytest.raises(LaunchError, match="give each rank on one host its own --node-id"):
            launch.claim_node_id(replace(cfg, node_id=first))
    finally:
        held.close()
    again, held = launch.claim_node_id(cfg)  # released with the socket
    held.close()
    assert again == first
