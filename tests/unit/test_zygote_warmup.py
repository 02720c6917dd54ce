"""The fork template says "ready" before it imports torch (the cluster does not wait for it)."""

from __future__ import annotations

import os
import sys

import pytest

from rayless.actors.host import zygote


def test_ready_is_printed_before_the_warm_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str] = []
    monkeypatch.setattr(sys, "argv", ["zygote", "/nonexistent/zygote.sock"])
    for name in ("RAYLESS_DIE_WITH_PARENT", "RAYLESS_TOKEN"):  # main() reads/pops them
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("RAYLESS_ZYGOTE_PRELOAD", raising=False)
    monkeypatch.setattr(zygote.Zygote, "start", lambda self: seen.append("start"))
    monkeypatch.setattr(
        zygote.Zygote, "warm_up", lambda self: seen.append("warm_up:" + capsys.readouterr().out)
    )
    monkeypatch.setattr(zygote.Zygote, "run", lambda self: seen.append("run"))
    zygote.main()
    assert seen == ["start", "warm_up:ready\n", "run"]


def test_lazy_mode_does_not_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(sys, "argv", ["zygote", "/nonexistent/zygote.sock"])
    for name in ("RAYLESS_DIE_WITH_PARENT", "RAYLESS_TOKEN"):  # main() reads/pops them
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAYLESS_ZYGOTE_PRELOAD", "lazy")
    monkeypatch.setattr(zygote.Zygote, "start", lambda self: None)
    monkeypatch.setattr(zygote.Zygote, "warm_up", lambda self: seen.append("warm_up"))
    monkeypatch.setattr(zygote.Zygote, "run", lambda self: seen.append("run"))
    zygote.main()
    assert seen == ["run"]


class _Exited(BaseException):
    pass


def test_a_sigterm_during_the_warm_up_ends_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    z = zygote.Zygote("/nonexistent/zygote.sock")
    codes: list[int] = []

    def importing(name: str) -> None:
        z._stop()  # the signal handler, as if SIGTERM came in mid-import

    def exit_now(code: int) -> None:
        codes.append(code)
        raise _Exited

    monkeypatch.setattr(zygote.importlib, "import_module", importing)
    monkeypatch.setattr(zygote.os, "_exit", exit_now)
    try:
        with pytest.raises(_Exited):
            z.warm_up()
        assert codes == [0] and not z.warming and not z.running
    finally:
        z.listener.close()
        z.sel.close()
        os.close(z.wake_r)
        os.close(z.wake_w)


def test_the_light_template_warms_up_without_torch_even_in_lazy_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(sys, "argv", ["zygote", "/nonexistent/z.sock", "--template", "light"])
    for name in ("RAYLESS_DIE_WITH_PARENT", "RAYLESS_TOKEN"):  # main() reads/pops them
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAYLESS_ZYGOTE_PRELOAD", "lazy")  # (the torch template's mode)
    monkeypatch.setattr(zygote.Zygote, "start", lambda self: None)
    monkeypatch.setattr(zygote.Zygote, "warm_up", lambda self: seen.append(self.modules))
    monkeypatch.setattr(zygote.Zygote, "run", lambda self: None)
    zygote.main()
    assert seen == [zygote.LIGHT_PRELOAD]
    assert not {"torch", "tensordict"} & set(zygote.LIGHT_PRELOAD)
