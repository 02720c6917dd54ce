"""``rayless k8s``: the Kubernetes manifests of a rayless job, and ``--apply`` to create them.

    rayless k8s manifest --nodes 4 --gpus-per-node 8 --image IMG -- train.py --lr 1e-4

One pod per node runs ``python -m rayless.actors.launch.node -- COMMAND``; the launch takes its
rank, the master's DNS name, its port and the token from the pod (``actors.launch.kubernetes``).
Two layouts, no operator or CRD of ours:

* ``jobset`` (the default): a JobSet with a ``leader`` Job (rank 0: head and driver) and a
  ``workers`` Indexed Job (ranks 1..N-1); JobSet makes the headless Service (DNS names
  ``<name>-leader-0-0.<name>``, ``<name>-workers-0-<i>.<name>``) and succeeds when the leader
  does.
* ``job``: an Indexed Job of N pods (rank = completion index) and a headless Service of the
  same name (DNS names ``<name>-<i>.<name>``; the pods' ``subdomain``).

Either with a Secret ``<name>-token`` holding a new token (or ``--secret NAME``: an existing
one, left out of the output), mounted read-only with mode 0400, never put in an environment
variable. ``--queue Q`` adds Kueue's ``kueue.x-k8s.io/queue-name`` label and creates the job
suspended, for Kueue to admit as a whole. GPUs are ``nvidia.com/gpu`` limits.

Rank 0's exit code is its pod's, so the Job's (and the JobSet's): a leader that fails fails
the job. A worker pod that fails or is deleted is replaced up to ``--max-restarts`` times (the
Job's ``backoffLimit``; default 0: the job fails) and its replacement rejoins the cluster under
the same node id; whether the run survives the loss is the driver's affair.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rayless.actors.launch import kubernetes as pod_env
from rayless.transport.files import atomic_write
from rayless.transport.protocol import new_token

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CONTAINER = "rayless"
TOKEN_DIR = "/var/run/secrets/rayless"
TOKEN_KEY = "token"
LEADER, WORKERS = "leader", "workers"
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


class Layout(Enum):
    """How the pods are grouped: a JobSet (leader + workers) or one Indexed Job + Service."""

    JOBSET = "jobset"
    JOB = "job"


@dataclass
class K8sJob:
    """A rayless job on Kubernetes: ``nodes`` pods of ``image`` running ``command``.

    Raises (on creation):
        ValueError: a name that is not a DNS label or makes a pod host name over 63
            characters, fewer than 1 node, negative GPUs or restarts.
    """

    name: str
    nodes: int
    image: str
    command: list[str] = field(default_factory=list)
    gpus_per_node: int = 0
    cpus: str | None = None  # a Kubernetes quantity: "16", "500m"
    memory: str | None = None  # "64Gi"
    layout: Layout = Layout.JOBSET
    queue: str | None = None  # a Kueue LocalQueue
    namespace: str | None = None
    secret: str | None = None  # an existing Secret with key "token"; None: one is written
    max_restarts: int = 0
    python: str = "python"  # the interpreter in the image
    launch_args: list[str] = field(default_factory=list)  # more ``rayless launch`` options
    grace_s: int = 30  # terminationGracePeriodSeconds: above the launch's --grace (10 s)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0 or self.max_restarts < 0:
            raise ValueError("gpus_per_node and max_restarts must be >= 0")
        longest = self.pod_hostname(self.nodes - 1)
        if not _NAME.fullmatch(self.name) or len(longest) > 63:
            raise ValueError(
                f"name {self.name!r} must be a lowercase DNS label whose pod host names "
                f"({longest}) stay within 63 characters"
            )

    @property
    def secret_name(self) -> str:
        """The Secret the pods mount."""
        return self.secret or f"{self.name}-token"

    def pod_hostname(self, rank: int) -> str:
        """The host name of rank ``rank``'s pod (also its node id)."""
        if self.layout is Layout.JOB:
            return f"{self.name}-{rank}"
        return f"{self.name}-{LEADER}-0-0" if rank == 0 else f"{self.name}-{WORKERS}-0-{rank - 1}"

    @property
    def master(self) -> str:
        """Rank 0's DNS name through the headless Service."""
        return f"{self.pod_hostname(0)}.{self.name}"

    def manifests(self, token: str | None = None) -> list[dict[str, Any]]:
        """The objects to create, in order: the Secret (unless ``secret`` names one; with
        ``token``, else a new one), then the Service and Job, or the JobSet."""
        out: list[dict[str, Any]] = []
        if self.secret is None:
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": self._metadata(self.secret_name, queue=False),
                    "type": "Opaque",
                    "stringData": {TOKEN_KEY: token or new_token()},
                }
            )
        if self.layout is Layout.JOB:
            out.append(self._service())
            job: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job"}
            job["metadata"] = self._metadata(self.name)
            job["spec"] = self._job_spec(self.nodes, 0, self.max_restarts, subdomain=True)
            if self.queue:
                job["spec"]["suspend"] = True
            out.append(job)
        else:
            out.append(self._jobset())
        return out

    # -- parts ----------------------------------------------------------------------------

    def _metadata(self, name: str, *, queue: bool = True) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if self.namespace:
            meta["namespace"] = self.namespace
        labels = {"app.kubernetes.io/managed-by": "rayless"}
        if queue and self.queue:
            labels[KUEUE_QUEUE_LABEL] = self.queue
        meta["labels"] = labels
        return meta

    def _service(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self._metadata(self.name, queue=False),
            "spec": {
                "clusterIP": "None",  # headless: a DNS name per pod, no virtual IP
                "publishNotReadyAddresses": True,  # names resolve before pods are ready
                "selector": {"job-name": self.name},
            },
        }

    def _job_spec(
        self, pods: int, rank_offset: int, backoff: int, *, subdomain: bool
    ) -> dict[str, Any]:
        env = [
            {"name": pod_env.ENV_NNODES, "value": str(self.nodes)},
            {"name": pod_env.ENV_MASTER, "value": self.master},
            {"name": pod_env.ENV_TOKEN_FILE, "value": f"{TOKEN_DIR}/{TOKEN_KEY}"},
        ]
        if rank_offset:
            env.append({"name": pod_env.ENV_RANK_OFFSET, "value": str(rank_offset)})
        limits: dict[str, str] = {}
        if self.gpus_per_node:
            limits["nvidia.com/gpu"] = str(self.gpus_per_node)
        if self.cpus:
            limits["cpu"] = self.cpus
        if self.memory:
            limits["memory"] = self.memory
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": self.image,
            "command": [
                self.python,
                "-m",
                "rayless.actors.launch.node",
                *self.launch_args,
                "--",
                *self.command,
            ],
            "env": env,
            "volumeMounts": [{"name": "rayless-token", "mountPath": TOKEN_DIR, "readOnly": True}],
        }
        if limits:
            container["resources"] = {"limits": limits}
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": self.grace_s,
            "containers": [container],
            "volumes": [
                {
                    "name": "rayless-token",
                    "secret": {"secretName": self.secret_name, "defaultMode": 0o400},
                }
            ],
        }
        if subdomain:
            pod["subdomain"] = self.name
        return {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": backoff,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "rayless"}},
                "spec": pod,
            },
        }

    def _jobset(self) -> dict[str, Any]:
        leader = self._job_spec(1, 0, 0, subdomain=False)
        jobs = [{"name": LEADER, "replicas": 1, "template": {"spec": leader}}]
        if self.nodes > 1:
            workers = self._job_spec(self.nodes - 1, 1, self.max_restarts, subdomain=False)
            jobs.append({"name": WORKERS, "replicas": 1, "template": {"spec": workers}})
        spec: dict[str, Any] = {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [LEADER]},
            "replicatedJobs": jobs,
        }
        if self.queue:
            spec["suspend"] = True
        return {
            "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
            "kind": "JobSet",
            "metadata": self._metadata(self.name),
            "spec": spec,
        }


def to_yaml(objects: Sequence[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML text (what ``kubectl apply -f`` reads)."""
    import yaml

    return "---\n".join(yaml.safe_dump(obj, sort_keys=False) for obj in objects)


def apply(
    objects: Sequence[dict[str, Any]], namespace: str = "default", api_client: Any = None
) -> list[str]:
    """Create the objects through the official ``kubernetes`` client (the JobSet through its
    custom-objects API); returns ``kind/name`` of each. Without ``api_client``, the kubeconfig
    (``$KUBECONFIG``, ``~/.kube/config``) or the in-cluster service account is used.

    Raises:
        ModuleNotFoundError: the ``kubernetes`` package is missing (the ``k8s`` extra).
        kubernetes.config.ConfigException: no kubeconfig and not in a pod.
        kubernetes.client.ApiException: the API server refused an object.
    """
    from kubernetes import client, config

    if api_client is None:
        try:
            config.load_kube_config()
        except config.ConfigException:
            config.load_incluster_config()
        api_client = client.ApiClient()
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    creators: dict[str, tuple[Any, Any]] = {
        "Secret": (core.create_namespaced_secret, client.V1Secret),
        "Service": (core.create_namespaced_service, client.V1Service),
        "Job": (batch.create_namespaced_job, client.V1Job),
    }
    done = []
    for obj in objects:
        kind, ns = obj["kind"], obj["metadata"].get("namespace", namespace)
        if kind == "JobSet":
            custom.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets", obj)
        elif kind in creators:
            create, model = creators[kind]
            from_dict = getattr(model, "from_dict", None)  # typed clients (>= 35) want models
            create(ns, obj if from_dict is None else from_dict(obj))
        else:
            raise ValueError(f"cannot apply a {kind}")
        done.append(f"{kind}/{obj['metadata']['name']}")
    return done


# -- command line -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``rayless k8s manifest``."""
    sub = parser.add_subparsers(dest="k8s_command", metavar="manifest", required=True)
    cmd = sub.add_parser("manifest", help="write (or --apply) the manifests of a job")
    cmd.add_argument("--nodes", type=int, required=True, help="pods, one launch each")
    cmd.add_argument("--image", required=True, help="container image with rayless installed")
    cmd.add_argument("--gpus-per-node", type=int, default=0, help="nvidia.com/gpu per pod")
    cmd.add_argument("--cpus", default=None, help="cpu limit per pod (a quantity: 16, 500m)")
    cmd.add_argument("--memory", default=None, help="memory limit per pod (64Gi)")
    cmd.add_argument("--name", default="rayless", help="job name (a DNS label)")
    cmd.add_argument("--kind", choices=[k.value for k in Layout], default="jobset")
    cmd.add_argument("--queue", default=None, help="Kueue LocalQueue (kueue.x-k8s.io/queue-name)")
    cmd.add_argument("--namespace", default=None, help="namespace of the objects")
    cmd.add_argument("--secret", default=None, help="existing Secret (key 'token') to mount")
    cmd.add_argument("--max-restarts", type=int, default=0, help="worker pod replacements")
    cmd.add_argument("--python", default="python", help="the image's Python interpreter")
    cmd.add_argument(
        "--launch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an option for rayless launch in each pod (repeat: --launch-arg=--grace=20)",
    )
    cmd.add_argument("-o", "--output", default=None, help="write here (mode 0600), not stdout")
    cmd.add_argument(
        "--format", choices=["yaml", "json"], default="yaml", help="yaml documents or a v1 List"
    )
    cmd.add_argument("--apply", action="store_true", help="create them (kubeconfig needed)")
    cmd.add_argument("driver", nargs=argparse.REMAINDER, metavar="-- COMMAND")


def job_from_args(args: argparse.Namespace) -> K8sJob:
    """The :class:`K8sJob` the options describe.

    Raises:
        ValueError: see :class:`K8sJob`.
    """
    command = list(args.driver or [])
    if command[:1] == ["--"]:
        command = command[1:]
    return K8sJob(
        name=args.name,
        nodes=args.nodes,
        image=args.image,
        command=command,
        gpus_per_node=args.gpus_per_node,
        cpus=args.cpus,
        memory=args.memory,
        layout=Layout(args.kind),
        queue=args.queue,
        namespace=args.namespace,
        secret=args.secret,
        max_restarts=args.max_restarts,
        python=args.python,
        launch_args=list(args.launch_arg),
    )


def run(args: argparse.Namespace) -> int:
    """``rayless k8s manifest``: print, write or apply the manifests."""
    try:
        job = job_from_args(args)
    except ValueError as exc:
        print(f"rayless k8s: error: {exc}", file=sys.stderr)
        return 2
    objects = job.manifests()
    if args.apply:
        for created in apply(objects, job.namespace or "default"):
            print(f"created {created}")
        return 0
    if args.format == "json":
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    else:
        text = to_yaml(objects)
    if args.output:  # it may hold the token: a new private file, never through a planted link
        atomic_write(args.output, text, perms=0o600)
    else:
        sys.stdout.write(text)
    return 0


__all__ = ["K8sJob", "Layout", "add_arguments", "apply", "job_from_args", "run", "to_yaml"]
