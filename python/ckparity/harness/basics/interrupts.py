"""SIGINT, SIGTERM and SIGHUP stop a run the same way: the loop stops at the
next Python instruction, and the report of what was measured is written with
status "interrupted". SIGTERM is what CI runners and `timeout` send; SIGHUP
what a closed terminal sends. A second signal while the report is being
written is held until it is written (nothing is lost)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

# the shell's convention: 128 + the signal's number
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
# a run's exit codes (DESIGN.md): 0 pass, 1 parity fail, 2 usage or input error, 3 report not written
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_RECORDED = 0, 1, 2, 3


def exit_code(result: dict) -> int:
    """A report's exit code: its status, or the signal that stopped it."""
    if result["status"] == "interrupted":
        return EXIT_CODES.get(result.get("stopped_by_signal"), 130)
    return EXIT_PASS if result["status"] == "pass" else EXIT_FAIL


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Stop:
    def __init__(self) -> None:
        self.raising = True
        self.signum: int | None = None

    def handler(self, signum, frame) -> None:
        self.signum = self.signum or signum
        if self.raising:
            self.raising = False
            raise Interrupted(signum)

    def hold(self) -> None:
        """From here on a signal is recorded, not raised."""
        self.raising = False


@contextmanager
def stop_on_signals():
    """Yields a _Stop whose ``signum`` is the signal that stopped the run, if any."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield stop
        return
    previous = {sig: signal.signal(sig, stop.handler) for sig in EXIT_CODES}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
