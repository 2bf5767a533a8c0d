"""The one pass rule: what each verdict of ``ckparity check`` means, whether
check exits 0 on it, and whether a parity gate (kernel_parity on a
``--backend``, optimizer_parity on an adamw one) passes it. docs/plugins.md
quotes this table (``python -m ckparity.check`` prints it; a test holds the
two equal): there is no second statement of the rule to drift from it."""

from __future__ import annotations

# verdict -> (what it means, check exits 0, a gate passes); worst last
RULE: dict[str, tuple[str, bool, bool]] = {
    "bitwise": ("every output and gradient has torch's bits", True, True),
    "as accurate as torch": ("close to torch, and a float64 error at most twice torch's (ckparity.measure.parity)",
                             True, True),
    "not supported": ("an option the backend declares it refuses (`register_backend(..., unsupported=[...])`): not "
                      "run; a training run that needs it refuses the backend before it starts", True, True),
    "less accurate": ("close to torch, but a float64 error more than twice torch's", True, False),
    "nondeterministic": ("1 and 2 threads give different bits, or a row's bits depend on the batch it sits in",
                         True, False),
    "wrong": ("not close to torch, a bad input accepted, or the slot's contract broken", False, False),
    "crashes": ("raised on valid input, or its process died (a signal) or ran past `--timeout`", False, False),
}
VERDICTS = list(RULE)


# a check stopped by a signal: no verdict on the kernel, and never a pass
INTERRUPTED = "interrupted"


def check_passes(verdict: str) -> bool:
    """``ckparity check``'s exit code: 0 unless the verdict is wrong or crashes (or the check was interrupted)."""
    return verdict != INTERRUPTED and RULE[verdict][1]


def gate_passes(verdict: str) -> bool:
    """A parity gate asks for torch's accuracy, deterministically."""
    return verdict != INTERRUPTED and RULE[verdict][2]


def worst(verdicts) -> str:
    """The worst verdict; an interrupted check is worse than any."""
    return max(verdicts, key=lambda v: len(VERDICTS) if v == INTERRUPTED else VERDICTS.index(v), default="bitwise")


def markdown() -> str:
    """The rule as docs/plugins.md shows it."""
    lines = ["| verdict | means | `ckparity check` exits | a parity gate |", "|---|---|---|---|"]
    for verdict, (meaning, check_ok, gate_ok) in RULE.items():
        lines.append(f"| {verdict} | {meaning} | {'0' if check_ok else '1'} | {'passes' if gate_ok else 'fails'} |")
    return "\n".join(lines)
