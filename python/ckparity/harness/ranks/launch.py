"""`ckparity train --tp N` / `--dp N` on this machine: the N ranks as
processes, the way torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in their environment, a free localhost port, gloo), so that the
same command under torchrun — one host or several — runs the same code with
torchrun as the launcher instead.

The launcher watches its ranks. A rank that dies breaks the others'
collectives at once (gloo closes the connection); a rank that hangs makes
them time out after --rank-timeout. Either way rank 0 writes the report of
what was measured with status "error"; once a rank has exited, the others get
--rank-timeout more to finish and are then killed, so a run never hangs. When
rank 0 itself died before writing, the launcher writes the report (status
"error", no measurements) saying which rank ended how."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from ... import kernels
from ..basics import report
from ..basics.config import RunConfig
from ..basics.interrupts import EXIT_CODES, Interrupted, exit_code, stop_on_signals

# after rank 0 has exited, the others have nothing left to give the report
GRACE_AFTER_RANK0_S = 5.0
# where a rank writes the exit code its run finished with, before it exits
FINISHED_ENV = "CKP_RANK_FINISHED"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe(code: int | None) -> str:
    if code is None:
        return "was killed by the launcher (still running at the deadline)"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with {code}"


# how much of a rank's stderr its ending quotes (the end of a traceback or an abort's message)
STDERR_TAIL_CHARS = 300


class _Ranks:
    """The rank processes and how each ended. Each rank's stderr goes to a
    file in ``scratch``, passed on to the launcher's stderr once the ranks
    have ended (``replay_stderr``): a rank that died quotes its last words in
    its ending (a SIGABRT's "terminate called after ..." was lost otherwise)."""

    def __init__(self, config: RunConfig, worker: RunConfig, scratch: Path) -> None:
        world = config.tp * config.dp
        # CKP_RUN_ID: the launch's one name, which the ranks' checkpoint directory marker carries
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "CKP_RUN_ID": uuid.uuid4().hex}
        command = [sys.executable, "-m", "ckparity.harness.ranks.launch", json.dumps(worker.to_dict())]
        self.stderr_paths = [scratch / f"rank{r}.stderr" for r in range(world)]
        self.finished_paths = [scratch / f"rank{r}.finished" for r in range(world)]
        self.procs = []
        for r, path in enumerate(self.stderr_paths):
            with open(path, "wb") as err:  # the child holds its own descriptor
                self.procs.append(subprocess.Popen(command, env={**env, "RANK": str(r), "LOCAL_RANK": str(r),
                                                                 FINISHED_ENV: str(self.finished_paths[r])},
                                                   stderr=err))
        self.killed: set[int] = set()

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def supervise(self, timeout: float) -> None:
        """Until every rank has exited; a rank still running at the deadline is killed."""
        deadline = None
        while self.running():
            if deadline is None and len(self.running()) < len(self.procs):
                grace = GRACE_AFTER_RANK0_S if self.procs[0].poll() is not None else timeout + GRACE_AFTER_RANK0_S
                deadline = time.monotonic() + grace
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
            time.sleep(0.05)

    def kill(self) -> None:
        for rank, p in enumerate(self.procs):
            if p.poll() is None:
                self.killed.add(rank)
                p.kill()
                p.wait()

    def stop(self, timeout: float) -> None:
        """A signal stopped the launcher: the ranks are told (SIGTERM: rank 0
        writes its report) and waited for, at most ``timeout``."""
        for p in self.running():
            p.send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout
        while self.running() and time.monotonic() < end:
            time.sleep(0.05)
        self.kill()

    def stderr_tail(self, rank: int) -> str:
        text = " ".join(self.stderr_paths[rank].read_text(errors="replace").split())
        return text if len(text) <= STDERR_TAIL_CHARS else "..." + text[-STDERR_TAIL_CHARS:]

    def replay_stderr(self) -> None:
        for path in self.stderr_paths:
            sys.stderr.write(path.read_text(errors="replace"))
        sys.stderr.flush()

    def finished_with(self, rank: int) -> int | None:
        """The exit code a rank's run finished with (its marker, written after its last collective and, on rank
        0, the report), or None where it did not get there."""
        path = self.finished_paths[rank]
        return int(path.read_text()) if path.exists() else None

    def endings(self) -> list[str]:
        """How each rank ended; a rank that did not end as a run ends quotes its stderr's last words. A rank
        killed by a signal after its run finished says so: gloo's teardown at exit aborts now and then ("terminate
        called without an active exception", seen in CI with every step done and the report written)."""
        failed = set(self.failed())
        endings = []
        for r, p in enumerate(self.procs):
            code = None if r in self.killed else p.returncode
            ending = f"rank {r} " + _describe(code)
            if code is not None and code < 0 and (finished := self.finished_with(r)) is not None:
                ending = f"rank {r} finished its run (exit code {finished}), then " + _describe(code) + " at exit"
            if r in failed and (tail := self.stderr_tail(r)):
                ending += f" (stderr: {tail})"
            endings.append(ending)
        return endings

    def failed(self) -> list[int]:
        """Ranks that did not end as a run ends (0 pass, 1 fail, or a stopping signal), nor finished their run
        before a signal killed them at exit."""
        return [r for r, p in enumerate(self.procs)
                if r in self.killed or (p.returncode not in (0, 1, *EXIT_CODES.values())
                                        and self.finished_with(r) not in (0, 1))]


def launch(config: RunConfig) -> dict:
    """Runs the --tp/--dp config on this machine; returns the report (also
    written to config.json_out)."""
    from ..loop.run import DEFAULT_JSON_OUT, lost_report

    json_out = config.json_out or DEFAULT_JSON_OUT
    report.check_writable(json_out, "--json-out")
    world = config.tp * config.dp
    # the ranks share the cores (the bits do not depend on the thread count)
    threads = config.threads or max(1, (os.cpu_count() or 1) // world)
    with tempfile.TemporaryDirectory(prefix="ckparity-ranks-") as scratch:
        rank0_out = Path(scratch) / "rank0.json"
        worker = replace(config, threads=threads, json_out=str(rank0_out), no_progress=True)
        ranks, stopped_by = _Ranks(config, worker, Path(scratch)), None
        with stop_on_signals() as stop:
            try:
                ranks.supervise(config.rank_timeout)
            except KeyboardInterrupt as err:
                stopped_by = err.signum if isinstance(err, Interrupted) else signal.SIGINT
                stop.hold()
                ranks.stop(config.rank_timeout)
            stop.hold()
            ranks.replay_stderr()
            endings, failed = ranks.endings(), ranks.failed()
            if rank0_out.exists():
                result = report.read_report(rank0_out)
            else:
                result = lost_report(worker, "rank 0 left no report: " + "; ".join(endings))
            if failed:  # the rank that ended first is the cause; rank 0's own error follows from it
                cause = f"rank {failed[0]} did not finish ({'; '.join(endings)})"
                result.update(status="error", pass_parity=False,
                              error=cause + (f"; rank 0: {result['error']}" if result["error"] else ""))
            if stopped_by is not None and result["status"] != "interrupted":
                result.update(status="interrupted", pass_parity=False, stopped_by_signal=stopped_by)
            result["config"]["json_out"] = config.json_out
            result["ranks"]["endings"] = endings
            report.write_json(json_out, result)
    return result


if __name__ == "__main__":  # one rank (see _Ranks)
    from ..loop.run import train

    kernels.load_configured()  # the parent's --plugin modules, through CKP_PLUGINS
    code = exit_code(train(RunConfig(**json.loads(sys.argv[1]))))
    if os.environ.get(FINISHED_ENV):  # the run is whole: what exit does after is teardown
        Path(os.environ[FINISHED_ENV]).write_text(str(code))
    sys.exit(code)
