"""``%distributed plan``: the magic's flags, what a launch would do, nothing started."""

from __future__ import annotations

import os

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell


def test_plan_prints_the_preview_of_the_flags(ip: InteractiveShell, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBACCEL_QUIET", "1")  # the answer to the command is printed all the same
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("%distributed plan forked"))
    ip.run_line_magic("distributed", "plan -n 3 --cpu --mixed-precision bf16 --max-restarts 2")
    out = capsys.readouterr().out
    assert out.startswith("nbaccel plan: 3 rank(s) on cpu, backend gloo, mixed precision bf16\nstart: fork")
    assert "  rank 2: cpu" in out and "  TORCHELASTIC_MAX_RESTARTS=2" in out and out.rstrip().endswith("(nothing was started)")


def test_plan_refuses_contradicting_flags_in_one_line(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="%distributed plan: gpus and cpu=True contradict each other"):
        ip.run_line_magic("distributed", "plan --gpus 0 --cpu")
