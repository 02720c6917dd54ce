"""``rayless launch`` in a Kubernetes job's pod: defaults from its environment, the Secret file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from rayless.actors.errors import LaunchError
from rayless.actors.launch import kubernetes
from rayless.actors.launch import node as launch
from rayless.actors.launch.procs import StopFlag
from rayless.actors.launch.tokens import DriverTokenFile, resolve_token

POD = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "JOB_COMPLETION_INDEX": "2",
    "HOSTNAME": "train-2",
    "RAYLESS_K8S_NNODES": "4",
    "RAYLESS_K8S_MASTER": "train-0.train",
    "RAYLESS_K8S_TOKEN_FILE": "/var/run/secrets/rayless/token",
}


def parse(*argv: str, env: dict[str, str]) -> launch.LaunchConfig:
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    return launch.config_from_args(parser.parse_args(list(argv)), env)


def test_an_indexed_job_pod_gives_rank_master_port_node_id_and_secret() -> None:
    cfg = parse("--", "train.py", env=POD)
    port = kubernetes.master_port("train-0.train")
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr, cfg.master_port) == (
        4,
        2,
        "train-0.train",
        port,
    )
    assert 20000 <= port < 30000 and port != kubernetes.master_port("other-0.other")
    assert cfg.default_node_id == "train-2"
    assert cfg.secret_token_file == "/var/run/secrets/rayless/token"
    assert cfg.token_file is None  # the driver gets a private copy, not the Secret's file


def test_a_jobset_worker_adds_the_offset_and_torchrun_still_wins() -> None:
    env = {**POD, "JOB_COMPLETION_INDEX": "0", "RAYLESS_K8S_RANK_OFFSET": "1"}
    assert parse(env=env).node_rank == 1
    env = {**env, "NODE_RANK": "3", "MASTER_PORT": "1234", "MASTER_ADDR": "m"}
    cfg = parse(env=env)
    assert (cfg.node_rank, cfg.master_port, cfg.master_addr) == (3, 1234, "m")
    env = {**POD, "RAYLESS_K8S_NNODES": "", "NNODES": "5"}  # a pod template of another tool
    assert (parse(env=env).nnodes, parse(env=env).node_rank) == (5, 2)


def test_slurm_variables_in_a_pod_are_ignored_and_outside_one_nothing_changes() -> None:
    slurm = {"SLURM_NNODES": "9", "SLURM_NODEID": "8", "SLURM_JOB_NODELIST": "gpu[1-9]"}
    cfg = parse(env={**POD, **slurm, "SLURM_JOB_ID": "7"})
    assert (cfg.nnodes, cfg.node_rank, cfg.master_addr) == (4, 2, "train-0.train")
    assert kubernetes.env_defaults({"JOB_COMPLETION_INDEX": "1"}) == {}  # not in a pod
    cfg = parse(env={**slurm, "JOB_COMPLETION_INDEX": "1"})
    assert (cfg.nnodes, cfg.node_rank) == (9, 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"RAYLESS_K8S_NNODES": ""}, "RAYLESS_K8S_NNODES must be set"),
        ({"JOB_COMPLETION_INDEX": "x"}, "JOB_COMPLETION_INDEX='x' is not an integer"),
        ({"RAYLESS_K8S_RANK_OFFSET": "one"}, "is not an integer"),
    ],
)
def test_bad_pod_variables_raise(change: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        parse(env={**POD, **change})


def secret_volume(tmp_path: Path, token: str = "s3cret\n", mode: int = 0o400) -> Path:
    """A directory laid out as the kubelet mounts a Secret volume; returns the key's path."""
    volume = tmp_path / "secret"
    data = volume / "..2026_12_06_05_00_00.000000001"
    data.mkdir(parents=True)
    (data / "token").write_text(token)
    os.chmod(data / "token", mode)
    os.symlink(data.name, volume / "..data")
    os.symlink("..data/token", volume / "token")
    return volume / "token"


def test_the_secret_file_as_the_kubelet_mounts_it_is_read(tmp_path: Path) -> None:
    path = secret_volume(tmp_path)
    assert kubernetes.read_secret_token(str(path)) == "s3cret"
    os.chmod(os.path.realpath(path), 0o440)  # fsGroup: group readable, our group
    os.chown(os.path.realpath(path), -1, os.getgid())
    assert kubernetes.read_secret_token(str(path)) == "s3cret"


@pytest.mark.parametrize(
    ("mode", "message"),
    [(0o444, "read by others"), (0o460, "written or read by others"), (0o404, "by others")],
)
def test_a_secret_file_others_can_read_or_write_is_refused(
    tmp_path: Path, mode: int, message: str
) -> None:
    path = secret_volume(tmp_path, mode=mode)
    with pytest.raises(LaunchError, match=message):
        kubernetes.read_secret_token(str(path))


def test_a_secret_link_out_of_its_volume_or_an_empty_secret_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.write_text("tok")
    os.chmod(outside, 0o400)
    volume = tmp_path / "vol"
    volume.mkdir()
    os.symlink(outside, volume / "token")
    with pytest.raises(LaunchError, match="leads out of its volume"):
        kubernetes.read_secret_token(str(volume / "token"))
    with pytest.raises(LaunchError, match="is empty"):
        kubernetes.read_secret_token(str(secret_volume(tmp_path / "e", token="\n")))
    with pytest.raises(LaunchError, match="cannot read"):
        kubernetes.read_secret_token(str(tmp_path / "missing"))


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another group needs root to make")
def test_a_secret_readable_by_a_group_not_ours_is_refused(tmp_path: Path) -> None:
    path = secret_volume(tmp_path, mode=0o440)
    stranger = max({os.getgid(), *os.getgroups()}) + 4242
    os.chown(os.path.realpath(path), -1, stranger)
    with pytest.raises(LaunchError, match=f"read by group {stranger}"):
        kubernetes.read_secret_token(str(path))


def test_the_launch_takes_the_secret_and_hands_the_driver_a_private_copy(
    tmp_path: Path,
) -> None:
    path = secret_volume(tmp_path)
    env = {**POD, "RAYLESS_K8S_TOKEN_FILE": str(path)}
    cfg = parse(env=env)
    assert resolve_token(cfg, StopFlag(), env) == "s3cret"
    copy = DriverTokenFile(cfg, "s3cret")
    try:
        assert copy.path != str(path)
        assert os.stat(copy.path).st_mode & 0o777 == 0o600
    finally:
        copy.remove()
