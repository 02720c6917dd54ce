"""The node agent's reading of why an actor ended (rayless.actors.control.death), over a fake
/proc, cgroup tree and kernel log in a temporary directory."""

from __future__ import annotations

import signal
from pathlib import Path

from rayless.actors.control.death import (
    OomWatch,
    cgroup_dir,
    death_details,
    describe_exit,
    kernel_log_oom,
    log_tail,
    oom_kill_count,
)
from rayless.actors.errors import ActorDiedError

PID = 4242
V2_EVENTS = "low 0\nhigh 0\nmax 3\noom {n}\noom_kill {n}\noom_group_kill 0\n"


def _fake_v2(tmp_path: Path, oom_kills: int) -> tuple[Path, Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / str(PID)).mkdir(parents=True)
    (proc / str(PID) / "cgroup").write_text("0::/job.slice/rayless\n")
    group = root / "job.slice" / "rayless"
    group.mkdir(parents=True)
    (group / "memory.events").write_text(V2_EVENTS.format(n=oom_kills))
    return proc, root, group


def test_sigkill_after_the_cgroup_oom_kill_count_rose_is_named_an_oom_kill(
    tmp_path: Path,
) -> None:
    proc, root, group = _fake_v2(tmp_path, oom_kills=2)
    watch = OomWatch(proc_root=str(proc), cgroup_root=str(root), kmsg=str(tmp_path / "none"))
    watch.started(PID)
    (group / "memory.events").write_text(V2_EVENTS.format(n=3))  # the kernel killed one
    cause = watch.cause(PID, -signal.SIGKILL)
    assert cause.oom
    assert cause.text.startswith("killed by SIGKILL, killed by the kernel's OOM killer")
    assert "oom_kill count rose from 2 to 3" in cause.text
    err = ActorDiedError("learner", pid=PID, exitcode=-9, cause=cause.text, log_tail=["x"])
    assert "killed by the kernel's OOM killer" in str(err) and "\n    x" in str(err)


def test_a_later_sigkill_without_a_new_oom_kill_is_not_blamed_on_the_oom_killer(
    tmp_path: Path,
) -> None:
    proc, root, group = _fake_v2(tmp_path, oom_kills=0)
    watch = OomWatch(proc_root=str(proc), cgroup_root=str(root), kmsg=str(tmp_path / "none"))
    watch.started(PID)
    (group / "memory.events").write_text(V2_EVENTS.format(n=1))
    assert watch.cause(PID, -signal.SIGKILL).oom
    watch.started(PID)  # a new process (same pid for the fake) in the same cgroup
    second = watch.cause(PID, -signal.SIGKILL)  # the count is still 1: someone's kill -9
    assert not second.oom and second.text == "killed by SIGKILL"


def test_exits_other_than_sigkill_are_never_oom_kills(tmp_path: Path) -> None:
    proc, root, group = _fake_v2(tmp_path, oom_kills=0)
    watch = OomWatch(proc_root=str(proc), cgroup_root=str(root), kmsg=str(tmp_path / "none"))
    watch.started(PID)
    (group / "memory.events").write_text(V2_EVENTS.format(n=5))
    assert watch.cause(PID, 3).text == "with exit code 3"
    watch.started(PID)
    assert watch.cause(PID, -signal.SIGSEGV).text == "killed by SIGSEGV"
    assert describe_exit(-200) == "killed by signal 200"


def test_cgroup_v1_memory_controller(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / str(PID)).mkdir(parents=True)
    (proc / str(PID) / "cgroup").write_text(
        "12:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n1:name=systemd:/docker/abc\n"
    )
    group = root / "memory" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    directory = cgroup_dir(PID, proc_root=str(proc), cgroup_root=str(root))
    assert directory == str(group)
    assert oom_kill_count(directory) == 7


def test_unreadable_evidence_is_no_evidence(tmp_path: Path) -> None:
    watch = OomWatch(
        proc_root=str(tmp_path / "noproc"),
        cgroup_root=str(tmp_path / "nocg"),
        kmsg=str(tmp_path / "nokmsg"),
    )
    watch.started(PID)
    cause = watch.cause(PID, -signal.SIGKILL)
    assert not cause.oom and cause.text == "killed by SIGKILL"
    assert oom_kill_count("") is None and kernel_log_oom(PID, str(tmp_path / "x")) is None


def test_the_kernel_log_naming_the_pid_is_an_oom_kill(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1000,5000,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=42421,uid=0\n"
        "3,1001,5001,-;Memory cgroup out of memory: Killed process 42421 (python)\n"
    )
    assert kernel_log_oom(PID, str(kmsg)) is False  # 42421 is not 4242
    with kmsg.open("a") as f:
        f.write("3,1002,5002,-;Memory cgroup out of memory: Killed process 4242 (python) ...\n")
    assert kernel_log_oom(PID, str(kmsg)) is True
    watch = OomWatch(proc_root=str(tmp_path), cgroup_root=str(tmp_path), kmsg=str(kmsg))
    watch.started(PID)  # no cgroup known: the kernel log alone decides
    cause = watch.cause(PID, -signal.SIGKILL)
    assert cause.oom and "the kernel log names pid 4242" in cause.text


def test_log_tail_reads_only_the_current_process_part(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("".join(f"old {i}\n" for i in range(5)))
    start = log.stat().st_size
    with log.open("a") as f:
        f.write("".join(f"new {i}\n" for i in range(30)) + "unterminated")
    tail = log_tail(str(log), start)
    assert len(tail) == 20 and tail[-1] == "unterminated" and tail[0] == "new 11"
    assert log_tail(str(log), start, lines=3) == ["new 28", "new 29", "unterminated"]
    log.write_text("x" * 200_000 + "\nlast\n")  # more than the bytes read: the cut line goes
    assert log_tail(str(log)) == ["last"]
    assert log_tail(str(tmp_path / "missing")) == []


def test_death_details_checks_an_event() -> None:
    ev = {"cause": "killed by SIGKILL", "log_tail": [f"l{i}" for i in range(30)], "log": "/p"}
    details = death_details(ev)
    assert details["cause"] == "killed by SIGKILL" and details["log"] == "/p"
    assert details["log_tail"] == [f"l{i}" for i in range(10, 30)]
    assert death_details({"log_tail": "not a list"}) == {"cause": "", "log_tail": [], "log": ""}
