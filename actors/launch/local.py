"""The processes of an embedded cluster on this host: ``Cluster.local`` and the test fixture.

A head, two fork templates (torch and light; leased from the process's pool,
:mod:`rayless.actors.launch.templates`, when it shares them) and N node agents, started with
the same mechanism as ``rayless launch`` (:mod:`rayless.actors.launch.procs`) on loopback
with a fresh random token, and a reaper (``rayless.actors.control.reaper``) that removes what
they and the driver leave on this host if they are killed (its sockets and logs are in
``/tmp/rayless-local-<pid>-<start>-*``, the driver's owner tag).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from rayless.actors.control.reaper import reaper_args, sweep_host
from rayless.actors.core.preload import preload_mode
from rayless.actors.launch import templates
from rayless.actors.launch.procs import START_TIMEOUT, Child, first_line, start_child, terminate
from rayless.transport import owners
from rayless.transport.protocol import new_token

__all__ = ["LocalProcesses"]


def _real_gpu_count() -> int:
    try:
        from rayless.placement import discover_node

        info = discover_node()
        return 0 if info.fake_gpus else len(info.gpus)
    except Exception:
        return 0


@dataclass
class LocalProcesses:
    """The processes of an embedded cluster on this host (blocking; loop-independent)."""

    nodes: int = 1
    gpus_per_node: int = 0
    node_timeout: float = 5.0
    zygote: bool = True
    log_dir: str | None = None
    zygote_preload: str = field(default_factory=preload_mode)  # RAYLESS_ZYGOTE_PRELOAD
    token: str = field(default_factory=new_token)
    address: str = ""
    head: Child | None = None
    zygote_proc: Child | None = None  # the torch template
    light_zygote_proc: Child | None = None  # the light template (no torch)
    agents: list[Child] = field(default_factory=list)
    reaper: Child | None = None
    tmpdir: str = ""
    # the pool whose templates it leases (None: its own); actors.launch.templates
    template_pool: templates.TemplatePool | None = field(default_factory=templates.pool)
    leases: list[templates.Lease] = field(default_factory=list)

    def _start(self, *args: str, **extra: str) -> Child:
        return start_child(args, self.token, os.environ, extra)

    def start(self) -> None:
        """Start the head, the zygote and the agents; wait until every agent joined.

        Raises:
            ValueError: bad sizes.
            StartError: a process did not start.
        """
        if self.nodes < 1 or self.gpus_per_node < 0:
            raise ValueError("nodes must be >= 1 and gpus_per_node >= 0")
        self.tmpdir = owners.mkdtemp("rayless-local-")
        log_dir = self.log_dir or os.path.join(self.tmpdir, "logs")
        try:
            self.head = self._start(
                "-m", "rayless.actors.control.head", "tcp://127.0.0.1:0", str(self.node_timeout)
            )
            zygote_path = light_path = "none"
            if self.zygote:
                zygote_path, light_path = self._start_templates()
            self.address = first_line(self.head, "the head", timeout=START_TIMEOUT)
            if self.leases:
                for lease in self.leases:
                    lease.wait_ready()
            else:
                if self.zygote_proc is not None:
                    first_line(self.zygote_proc, "the zygote", timeout=START_TIMEOUT)
                if self.light_zygote_proc is not None:
                    first_line(self.light_zygote_proc, "the light zygote", timeout=START_TIMEOUT)
            real = _real_gpu_count() if self.gpus_per_node else 0
            use_real = self.gpus_per_node > 0 and real >= self.nodes * self.gpus_per_node
            for i in range(self.nodes):
                args = ["-m", "rayless.actors.control.agent", self.address]
                args += ["--node-id", f"node-{i}", "--ip", "127.0.0.1", "--zygote", zygote_path]
                args += ["--light-zygote", light_path]
                args += ["--log-dir", log_dir, "--head-timeout", str(self.node_timeout)]
                extra: dict[str, str] = {}
                if use_real:
                    first = i * self.gpus_per_node
                    visible = range(first, first + self.gpus_per_node)
                    extra["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, visible))
                else:
                    args += ["--fake-gpus", str(self.gpus_per_node)]
                self.agents.append(self._start(*args, **extra))
            for i, agent in enumerate(self.agents):
                first_line(agent, f"node agent {i}", timeout=START_TIMEOUT)
            self.reaper = _start_reaper([os.getpid(), *self.pids])
        except BaseException:
            self.stop()
            raise

    def _start_templates(self) -> tuple[str, str]:
        """Start (or lease, when this process shares them) the torch and light templates;
        their socket paths."""
        pool = self.template_pool
        if pool is not None:
            for kind in ("torch", "light"):  # one by one: stop() releases what was leased
                self.leases.append(pool.acquire(kind, os.environ))
            self.zygote_proc, self.light_zygote_proc = (lease.proc for lease in self.leases)
            return self.leases[0].path, self.leases[1].path
        zygote_path = os.path.join(self.tmpdir, "zygote.sock")
        light_path = os.path.join(self.tmpdir, "zygote-light.sock")
        zygote_args = ("-m", "rayless.actors.host.zygote", zygote_path)
        self.zygote_proc = start_child(  # the fork templates never hold the token
            zygote_args, None, os.environ, {"RAYLESS_ZYGOTE_PRELOAD": self.zygote_preload}
        )
        light_args = ("-m", "rayless.actors.host.zygote", light_path, "--template", "light")
        self.light_zygote_proc = start_child(light_args, None, os.environ, {})
        return zygote_path, light_path

    @property
    def pids(self) -> list[int]:
        """Pids of the head, the zygotes and the agents."""
        procs = [self.head, self.zygote_proc, self.light_zygote_proc, *self.agents]
        return [p.pid for p in procs if p is not None]

    def stop(self, grace: float = 10.0) -> None:
        """Shut the cluster down: SIGTERM to the head (it stops the agents, which stop their
        actors), wait, then SIGTERM → grace → SIGKILL what is left; the zygote goes last, so
        agents never see it vanish under them. Idempotent.
        """
        others = [p for p in [self.head, *self.agents] if p is not None]
        if self.head is not None and self.head.poll() is None:
            self.head.send_signal(signal.SIGTERM)  # a no-op race if a shutdown is under way
        terminate(others, grace, natural=grace / 2)
        if self.leases:  # shared: back to the pool, running (their actors went with the agents)
            for lease in self.leases:
                lease.release()
            self.leases = []
        else:
            zygotes = [p for p in (self.zygote_proc, self.light_zygote_proc) if p is not None]
            if zygotes:
                terminate(zygotes, grace)
        self.head, self.zygote_proc, self.light_zygote_proc, self.agents = None, None, None, []
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = ""
        if self.reaper is not None:  # stopped: what is left, this process removes now
            terminate([self.reaper], grace)
            self.reaper = None
            sweep_host()  # what actors killed on the way left (killed with their agent...)


def _start_reaper(pids: list[int]) -> Child:
    """The reaper watching ``pids`` (``rayless.actors.control.reaper``): its own session (a
    terminal's Ctrl-C and SIGHUP are not for it), no token, no pipes (it may outlive every
    reader of ours), and it does not die with this process: that is its purpose."""
    env = {k: v for k, v in os.environ.items() if k != "RAYLESS_DIE_WITH_PARENT"}
    return subprocess.Popen(
        [sys.executable, "-m", "rayless.actors.control.reaper", *reaper_args(pids)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={k: v for k, v in env.items() if not k.startswith("RAYLESS_TOKEN")},
        start_new_session=True,
    )
