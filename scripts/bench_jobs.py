"""Job submission: how long ``submit_job`` takes to return, and how long a job takes from
submit to SUCCEEDED, on rayless (a local cluster, ``rayless.ray.job_submission``) and on Ray
(its dashboard's job server, where Ray is installed), each in a child process of one run.

    python scripts/bench_jobs.py [--repeats 5]

Two entrypoints: ``echo hi``, and a driver that joins the cluster (``ray.init()``) and runs one
task. Medians of ``--repeats`` jobs after one warm-up job; milliseconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from typing import Any


def _client(which: str) -> tuple[Any, Any, str]:
    if which == "ray":
        import ray
        from ray.job_submission import JobStatus, JobSubmissionClient

        ray.init(include_dashboard=True, num_cpus=2)
        url = "http://" + ray._private.worker.global_worker.node.address_info["webui_url"]
        return JobSubmissionClient(url), JobStatus, "ray"
    from rayless.actors import Cluster
    from rayless.ray.job_submission import JobStatus, JobSubmissionClient

    _client.cluster = Cluster.local_sync()  # type: ignore[attr-defined]
    return JobSubmissionClient(), JobStatus, "rayless.ray"


def measure(which: str, repeats: int) -> dict[str, list[float]]:
    """``{entrypoint: [submit returns, submit to SUCCEEDED]}`` in ms, medians."""
    client, status, module = _client(which)
    driver = (
        f'{sys.executable} -c "import {module} as ray; ray.init(); '
        'print(ray.get(ray.remote(lambda: 1).remote()))"'
    )

    def one(entry: str) -> tuple[float, float]:
        for _ in range(120):  # Ray's job agent may refuse the first submits
            try:
                t0 = time.perf_counter()
                sid = client.submit_job(entrypoint=entry)
                t1 = time.perf_counter()
                break
            except RuntimeError as exc:
                if "No available agent" not in str(exc):
                    raise
                time.sleep(1)
        while not client.get_job_status(sid).is_terminal():
            time.sleep(0.01)
        t2 = time.perf_counter()
        if client.get_job_status(sid) != status.SUCCEEDED:
            raise RuntimeError(f"{entry!r} failed:\n{client.get_job_logs(sid)}")
        return (t1 - t0) * 1000, (t2 - t0) * 1000

    one("true")
    out = {}
    for name, entry in (("echo hi", "echo hi"), ("driver + one task", driver)):
        runs = [one(entry) for _ in range(repeats)]
        out[name] = [
            round(statistics.median(r[0] for r in runs), 1),
            round(statistics.median(r[1] for r in runs), 1),
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", choices=["ray", "rayless"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.repeats)))
        return
    sides = ["rayless"] + (["ray"] if importlib.util.find_spec("ray") else [])
    results = {}
    for side in sides:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", side, "--repeats", str(args.repeats)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{side}: {proc.stderr[-2000:]}")
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    print("entrypoint | side | submit returns (ms) | submit to SUCCEEDED (ms)")
    for name in results["rayless"]:
        for side in sides:
            submit, done = results[side][name]
            print(f"{name} | {side} | {submit} | {done}")


if __name__ == "__main__":
    main()
