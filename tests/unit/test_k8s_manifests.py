"""``rayless k8s``'s manifests, checked against the official client's Kubernetes API types
(every field known, required ones present) and JobSet's published API (v1alpha2 types), and
``--apply`` against recording stand-ins of the client's API classes."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from pathlib import Path
from typing import Any

import pytest

from rayless import k8s
from rayless.actors.launch import kubernetes as pod_env
from rayless.cli import main

client = pytest.importorskip("kubernetes.client", reason="the k8s extra (kubernetes) is missing")

REPO = Path(__file__).resolve().parents[2]
MODELS = {"Secret": "V1Secret", "Service": "V1Service", "Job": "V1Job"}
# JobSet v1alpha2 (sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go): the fields of the
# parts we write, and the required ones
JOBSET_SPEC = {
    "replicatedJobs",
    "network",
    "successPolicy",
    "failurePolicy",
    "startupPolicy",
    "suspend",
    "coordinator",
    "managedBy",
    "ttlSecondsAfterFinished",
    "volumeClaimPolicies",
}
REPLICATED_JOB = {"name", "groupName", "template", "replicas", "dependsOn"}
NETWORK = {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}
SUCCESS_POLICY = {"operator", "targetReplicatedJobs"}


def round_trip(obj: dict[str, Any], model: str) -> None:
    """``obj`` deserializes into the client's ``model`` and back unchanged: no unknown field
    (the client drops those), no required field missing (its models refuse that)."""
    api = client.ApiClient()
    back = api.sanitize_for_serialization(api._ApiClient__deserialize(obj, model))
    assert back == obj


def check_jobset(obj: dict[str, Any]) -> None:
    assert obj["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    round_trip(obj["metadata"], "V1ObjectMeta")
    spec = obj["spec"]
    assert set(spec) <= JOBSET_SPEC and spec["replicatedJobs"]
    assert set(spec["network"]) <= NETWORK
    assert set(spec["successPolicy"]) <= SUCCESS_POLICY
    assert spec["successPolicy"]["operator"] in ("All", "Any")
    names = [r["name"] for r in spec["replicatedJobs"]]
    assert set(spec["successPolicy"]["targetReplicatedJobs"]) <= set(names)
    assert len(set(names)) == len(names)
    for rjob in spec["replicatedJobs"]:
        assert set(rjob) <= REPLICATED_JOB and {"name", "template"} <= set(rjob)
        assert isinstance(rjob["replicas"], int) and rjob["replicas"] >= 1
        round_trip(rjob["template"], "V1JobTemplateSpec")


def check(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] == "JobSet":
            check_jobset(obj)
        else:
            round_trip(obj, MODELS[obj["kind"]])


def env_of(job_spec: dict[str, Any]) -> dict[str, str]:
    container = job_spec["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"]}


def test_the_indexed_job_layout_is_valid_and_gives_each_pod_its_launch() -> None:
    job = k8s.K8sJob(
        name="ppo",
        nodes=3,
        image="img:1",
        command=["train.py", "--lr", "1e-4"],
        gpus_per_node=8,
        cpus="16",
        memory="64Gi",
        layout=k8s.Layout.JOB,
        namespace="rl",
    )
    objects = job.manifests(token="t0k")
    check(objects)
    secret, service, batch = objects
    assert [o["kind"] for o in objects] == ["Secret", "Service", "Job"]
    assert secret["stringData"] == {"token": "t0k"} and secret["metadata"]["name"] == "ppo-token"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": "ppo"}
    spec = batch["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimit"] == 0 and "suspend" not in spec
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "ppo" and pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    launch = ["python", "-m", "rayless.actors.launch.node", "--"]
    assert container["command"] == [*launch, "train.py", "--lr", "1e-4"]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "8", "cpu": "16", "memory": "64Gi"}
    }
    assert env_of(spec) == {
        pod_env.ENV_NNODES: "3",
        pod_env.ENV_MASTER: "ppo-0.ppo",
        pod_env.ENV_TOKEN_FILE: "/var/run/secrets/rayless/token",
    }
    assert pod["volumes"] == [
        {"name": "rayless-token", "secret": {"secretName": "ppo-token", "defaultMode": 0o400}}
    ]
    assert all(o["metadata"]["namespace"] == "rl" for o in objects)
    assert [job.pod_hostname(r) for r in range(3)] == ["ppo-0", "ppo-1", "ppo-2"]


def test_the_jobset_layout_is_valid_leader_rank_0_workers_offset_by_one() -> None:
    job = k8s.K8sJob(name="ppo", nodes=4, image="img:1", command=["train.py"], max_restarts=2)
    objects = job.manifests()
    check(objects)
    assert [o["kind"] for o in objects] == ["Secret", "JobSet"]
    assert len(objects[0]["stringData"]["token"]) == 64  # a fresh token
    spec = objects[1]["spec"]
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["leader"]}
    assert spec["network"]["enableDNSHostnames"] is True
    leader, workers = (r["template"]["spec"] for r in spec["replicatedJobs"])
    assert (leader["completions"], leader["backoffLimit"]) == (1, 0)
    assert (workers["completions"], workers["parallelism"], workers["backoffLimit"]) == (3, 3, 2)
    assert env_of(leader)[pod_env.ENV_MASTER] == "ppo-leader-0-0.ppo"
    assert pod_env.ENV_RANK_OFFSET not in env_of(leader)
    assert env_of(workers)[pod_env.ENV_RANK_OFFSET] == "1"
    assert "subdomain" not in leader["template"]["spec"]  # JobSet sets it
    assert job.pod_hostname(3) == "ppo-workers-0-2"
    one = k8s.K8sJob(name="solo", nodes=1, image="i").manifests()[1]
    assert [r["name"] for r in one["spec"]["replicatedJobs"]] == ["leader"]


@pytest.mark.parametrize("layout", list(k8s.Layout))
def test_a_kueue_queue_labels_the_job_and_creates_it_suspended(layout: k8s.Layout) -> None:
    objects = k8s.K8sJob(
        name="q", nodes=2, image="i", layout=layout, queue="team-a", secret="mine"
    ).manifests()
    check(objects)
    assert "Secret" not in [o["kind"] for o in objects]  # an existing Secret: not written
    top = objects[-1]
    assert top["metadata"]["labels"][k8s.KUEUE_QUEUE_LABEL] == "team-a"
    assert top["spec"]["suspend"] is True
    text = json.dumps(top)
    assert '"secretName": "mine"' in text


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "Bad_Name"},
        {"name": "x" * 60},  # x...x-workers-0-0 is over 63 characters
        {"nodes": 0},
        {"gpus_per_node": -1},
    ],
)
def test_bad_jobs_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        k8s.K8sJob(**{"name": "ok", "nodes": 2, "image": "i", **kwargs})


def test_the_command_line_writes_yaml_or_json_privately(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    argv = ["k8s", "manifest", "--nodes", "2", "--image", "img", "--kind", "job"]
    assert main([*argv, "--launch-arg=--fake-gpus=2", "--", "train.py", "-x"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    check(objects)
    command = objects[2]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-4:] == ["--fake-gpus=2", "--", "train.py", "-x"]
    out = tmp_path / "job.json"
    assert main([*argv, "--format", "json", "-o", str(out)]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    listed = json.loads(out.read_text())
    assert listed["kind"] == "List" and [o["kind"] for o in listed["items"]] == [
        "Secret",
        "Service",
        "Job",
    ]
    assert main(["k8s", "manifest", "--nodes", "0", "--image", "i"]) == 2
    assert "nodes must be >= 1" in capsys.readouterr().err


class Recorder:
    """A stand-in for one of the client's API classes: records the create calls."""

    calls: list[tuple[str, tuple[Any, ...]]] = []

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def __getattr__(self, name: str) -> Any:
        return lambda *args: Recorder.calls.append((name, args))


def test_apply_creates_each_object_through_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in ("CoreV1Api", "BatchV1Api", "CustomObjectsApi"):
        monkeypatch.setattr(client, cls, Recorder)
    Recorder.calls = []
    job = k8s.K8sJob(name="a", nodes=2, image="i", layout=k8s.Layout.JOB)
    assert k8s.apply(job.manifests(), "ns", api_client=object()) == [
        "Secret/a-token",
        "Service/a",
        "Job/a",
    ]
    assert [(name, args[0], type(args[1]).__name__) for name, args in Recorder.calls] == [
        ("create_namespaced_secret", "ns", "V1Secret"),
        ("create_namespaced_service", "ns", "V1Service"),
        ("create_namespaced_job", "ns", "V1Job"),
    ]
    assert Recorder.calls[2][1][1].spec.completions == 2
    Recorder.calls = []
    jobset = k8s.K8sJob(name="b", nodes=2, image="i", secret="s").manifests()
    assert k8s.apply(jobset, "ns", api_client=object()) == ["JobSet/b"]
    assert Recorder.calls == [
        (
            "create_namespaced_custom_object",
            ("jobset.x-k8s.io", "v1alpha2", "ns", "jobsets", jobset[0]),
        )
    ]


def test_the_docs_examples_are_what_rayless_k8s_writes(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    text = (REPO / "docs" / "launching.md").read_text()
    section = text[text.index("## Kubernetes") : text.index("## SSH")]
    examples = re.findall(
        r"```bash\n(rayless k8s manifest .*?) > \S+\n.*?```\s*```yaml\n(.*?)```", section, re.S
    )
    assert len(examples) == 2, "docs/launching.md: the JobSet and Indexed Job examples"
    kinds = []
    for command, shown in examples:
        argv = shlex.split(command.replace("\\\n", " "))
        capsys.readouterr()
        assert main(argv[1:]) == 0
        assert capsys.readouterr().out == shown, f"rerun `{command}` for the docs"
        objects = list(yaml.safe_load_all(shown))
        check(objects)
        kinds.append(objects[-1]["kind"])
    assert kinds == ["JobSet", "Job"]


def test_the_output_file_is_never_written_through_a_planted_link_or_an_open_mode(
    tmp_path: Path,
) -> None:
    # -o may hold the cluster token: a link planted at its name must not redirect it, and an
    # existing world-readable file must not keep its mode
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    planted = tmp_path / "planted.yaml"
    planted.symlink_to(victim)
    argv = ["k8s", "manifest", "--nodes", "2", "--image", "img", "-o"]
    assert main([*argv, str(planted)]) == 0
    assert victim.read_text() == "untouched\n" and not planted.is_symlink()
    assert stat.S_IMODE(os.stat(planted).st_mode) == 0o600
    loose = tmp_path / "loose.yaml"
    loose.write_text("old\n")
    loose.chmod(0o644)
    assert main([*argv, str(loose)]) == 0
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o600
