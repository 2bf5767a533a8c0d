"""One training run in a process of its own: ``python -m
ckparity.harness.loop.child CONFIG_JSON`` (attribute's variants, and the
gates' runs when they train a user's backends). A segfault or an abort in a
user's C ends the child, not the command that started it: ``train_in_child``
reads the child's report, or says how it ended when it wrote none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ... import kernels
from ..basics import progress
from ..basics.config import RunConfig
from ..basics.report import read_report, write_json


def command(config: RunConfig, carry: dict | None = None) -> list[str]:
    """The child's command line; ``carry`` (kernels.carried) what it loads besides CKP_PLUGINS."""
    return [sys.executable, "-m", "ckparity.harness.loop.child", json.dumps(config.to_dict()),
            json.dumps(carry or {"plugins": [], "attrs": []})]


def ending(returncode: int) -> str:
    return f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit {returncode}"


def ended_without_report(config: RunConfig, returncode: int, hung: bool = False) -> dict:
    """What a gate reads of a run whose process wrote no report: an error, saying how it ended."""
    how = f"hung (no slot called for {config.hang_timeout:g} s) and killed" if hung else ending(returncode)
    return {"status": "error", "error": f"the run's process was {how} and wrote no report",
            "config": config.to_dict(), "steps": 0, "pass_parity": False, "first_loss_fail_step": None,
            "first_param_fail_step": None, "max_loss_abs_diff": None, "max_param_abs_diff": None,
            "first_nonfinite_step": None, "localization": None, "ranks": None, "shadow": None, "envelope": None,
            "env": {}, "series": {}, "stopped_by_signal": None}


def users_backends(config: RunConfig) -> list[str]:
    """The backends ``config`` names that are not ckparity's own or torch's: a user's, which may crash."""
    return [getattr(config, flag) for flag, kernel in kernels.FLAGS.items()
            if getattr(config, flag) not in kernels.KERNELS[kernel].builtin]


def place(where: dict) -> str:
    """Where a dead child was (basics/progress.py's record): "the forward of linear at step 3"."""
    stage = f"the {where['stage']} of {where['kernel']}" if where.get("kernel") else where.get("stage") or "its set-up"
    return stage if where.get("step") is None else f"{stage} at step {where['step']}"  # a gate's twins count no steps


def carry_for(config: RunConfig) -> dict | None:
    """What a child loads to have every backend ``config`` names (kernels.carried, merged), or
    None where one of them only this process can reach."""
    return kernels.carried_together((kernel, getattr(config, flag)) for flag, kernel in kernels.FLAGS.items())


def killed_if_hung(proc: subprocess.Popen, where_file: str | None, timeout: float) -> bool:
    """Waits for the child; True when its place record (basics/progress.py: every slot call changes it)
    stood still for ``timeout`` seconds, the child then killed -- a kernel stuck in C never returns to
    the interpreter that would handle a gentler signal. ``where_file`` None or timeout 0: waits."""
    if where_file is None or timeout <= 0:
        proc.wait()
        return False
    seen, since = None, time.monotonic()
    while True:
        try:
            proc.wait(timeout=min(0.5, timeout))
            return False
        except subprocess.TimeoutExpired:
            now = progress.raw(where_file)
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since >= timeout:
                proc.kill()
                proc.wait()
                return True


def train_in_child(config: RunConfig, carry: dict, where_file: str | None = None) -> dict:
    """train(config) in a child process that loads ``carry`` (config.json_out
    names its report); a signal to this process is passed on to the child,
    which then writes its interrupted report, and is waited for. With
    ``where_file`` (the child's place record) a child that stands still for
    config.hang_timeout seconds is killed as hung."""
    Path(config.json_out).unlink(missing_ok=True)  # an earlier run's report must not pass for this one's
    proc = subprocess.Popen(command(config, carry), stdout=subprocess.DEVNULL, env=kernels.child_env(carry))
    try:
        hung = killed_if_hung(proc, where_file, config.hang_timeout)
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    if Path(config.json_out).exists() and not hung:
        return read_report(config.json_out)
    return ended_without_report(config, proc.returncode, hung)


def train_isolated(config: RunConfig, carry: dict) -> dict:
    """train_in_child, keeping the child's place (basics/progress.py): a child that dies by a signal or
    writes no report leaves a report naming the kernel, the step and the stage it was in, written here."""
    with tempfile.TemporaryDirectory(prefix="ckparity-progress-") as scratch:
        where_file = str(Path(scratch) / "where")
        os.environ[progress.ENV] = where_file
        try:
            result = train_in_child(config, carry, where_file)
        finally:
            os.environ.pop(progress.ENV, None)
        if result["status"] != "error" or "wrote no report" not in (result["error"] or ""):
            return result
        where = progress.read(where_file) or {}
    result["error"] += f", in {place(where)}"
    # the steps before it ran; their figures died with the child (a report is written at the end of a run)
    result["steps"] = max((where.get("step") or 1) - 1, 0)
    result["crash"] = {"ending": result["error"].split(" and wrote")[0].removeprefix("the run's process was "),
                       "step": where.get("step"), "stage": where.get("stage"), "kernel": where.get("kernel"),
                       "backend": getattr(config, kernels.KERNELS[where["kernel"]].flag) if where.get("kernel") else None}
    write_json(config.json_out, result)
    return result


if __name__ == "__main__":
    from .run import train

    kernels.load_configured()  # the parent's --plugin modules, through CKP_PLUGINS
    kernels.load_carried(json.loads(sys.argv[2]))
    progress.start()
    train(RunConfig(**json.loads(sys.argv[1])))
