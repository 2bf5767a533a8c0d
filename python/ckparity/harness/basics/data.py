"""The token stream both twins train on, and its windows.

Tokens are seeded random integers in [0, vocab), or the bytes of a text file
mod vocab, repeated until the stream has total_tokens (as the seed's harness
does: a 6-byte "Hello!" trains like any other text). A window is seq_len
input tokens and the seq_len tokens that follow each of them as targets; a
micro-batch is batch_size consecutive windows (B, T); a step is grad_accum
micro-batches. When the windows of an epoch do not divide evenly, the
epoch's last step is partial: it takes the windows that are left (and its
micro-losses are scaled by 1/len(step), not 1/grad_accum). With
--ignore-frac, that fraction of the targets (chosen by the seed) is set to
ignore_index (-100)."""

from __future__ import annotations

from pathlib import Path

import torch

from .config import UsageError

IGNORE_INDEX = -100


def load_tokens(config) -> torch.Tensor:
    if config.train_text:
        path = Path(config.train_text)
        try:
            raw = path.read_bytes()
        except OSError as err:
            raise UsageError(f"cannot read --train-text {path}: {err.strerror}") from None
        if not raw:
            raise UsageError(f"--train-text {path} is empty")
        text = torch.tensor(list(raw[: config.total_tokens]), dtype=torch.int64) % config.vocab
        tokens = text.repeat(-(-config.total_tokens // text.numel()))[: config.total_tokens]
    else:
        generator = torch.Generator().manual_seed(config.seed)
        tokens = torch.randint(0, config.vocab, (config.total_tokens,), generator=generator)
    needed = config.seq_len * config.grad_accum + 1
    if tokens.numel() < needed:
        raise UsageError(f"{tokens.numel()} tokens are fewer than one step needs "
                         f"(seq_len*grad_accum + 1 = {needed})")
    return tokens


def make_targets(tokens: torch.Tensor, config) -> torch.Tensor:
    """targets[i] = tokens[i + 1], with the --ignore-frac fraction masked."""
    targets = tokens[1:].clone()
    if config.ignore_frac > 0:
        generator = torch.Generator().manual_seed(config.seed + 1)
        mask = torch.rand(targets.shape, generator=generator) < config.ignore_frac
        targets[mask] = IGNORE_INDEX
    return targets


class Batches:
    """Step s (0-based) is windows [s*K, (s+1)*K) of the stream (cut at the
    epoch's end), epoch after epoch."""

    def __init__(self, tokens: torch.Tensor, config) -> None:
        self.inputs = tokens[:-1]
        self.targets = make_targets(tokens, config)
        self.seq_len, self.grad_accum, self.batch_size = config.seq_len, config.grad_accum, config.batch_size
        self.windows_per_epoch = self.inputs.numel() // self.seq_len
        self.steps_per_epoch = -(-self.windows_per_epoch // (self.grad_accum * self.batch_size))
        # the whole run's steps (an lr schedule's length); --max-steps cuts the run, not the schedule
        self.total_steps = self.steps_per_epoch * config.epochs
        self.num_steps = min(self.total_steps, config.max_steps) if config.max_steps > 0 else self.total_steps

    def step(self, s: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The step's micro-batches: (tokens, targets), each (B, T)."""
        per_step = self.grad_accum * self.batch_size
        first = (s % self.steps_per_epoch) * per_step
        last = min(first + per_step, self.windows_per_epoch)
        T, out = self.seq_len, []
        for lo in range(first, last, self.batch_size):
            windows = range(lo, min(lo + self.batch_size, last))
            out.append((torch.stack([self.inputs[w * T: (w + 1) * T] for w in windows]),
                        torch.stack([self.targets[w * T: (w + 1) * T] for w in windows])))
        return out

    def __iter__(self):
        """(step, windows) for steps 1..num_steps."""
        return self.after(0)

    def after(self, done: int):
        """(step, windows) for steps done+1..num_steps (a resumed run's)."""
        for s in range(done, self.num_steps):
            yield s + 1, self.step(s)
