"""Bad, unusual and hostile inputs against long runs, dumps, --init-from,
plugins and the gates' config, each through the command line of the
ckparity this Python has installed, and what became of each:

- handled: the outcome the input deserves (exit 2 with one line naming the
  problem, before any work; or, where the input is legitimate, the run doing
  the right thing) and nothing of the user's lost;
- traceback: a Python traceback (exit 1 with no report);
- mishandled: anything else -- data lost, another run silently continued,
  a verdict on a kernel for bit rot.

    python scripts/bad_inputs.py --json-out reports/bad_inputs/after.json

Run it with another installation's Python (a checkout of an older commit,
set up with scripts/setup.sh) for the "before" column: the cases use only
the command line. Each case runs in a fresh directory of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = ["train", "--max-steps", "4", "--no-progress", "--json-out", "r.json"]
CKPT = ["--checkpoint-every", "2", "--checkpoint-dir", "ck"]


def ckparity(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckparity", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "CKP_PLUGINS": "", **(env or {})})


# ---- what a case starts from ------------------------------------------------------

def checkpoint(cwd: Path, *flags: str) -> Path:
    done = ckparity(cwd, *RUN, *CKPT, *flags)
    assert done.returncode == 0, done.stderr[-500:]
    return cwd / "ck"


def step_dir(cwd: Path) -> Path:
    return cwd / "ck" / (cwd / "ck" / "latest").read_text().strip()


def edit_manifest(cwd: Path, change) -> None:
    path = step_dir(cwd) / "checkpoint.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def dump(cwd: Path, name: str = "d", step: int = 2) -> Path:
    done = ckparity(cwd, *RUN, "--dump-step", str(step), "--dump-dir", name)
    assert done.returncode == 0, done.stderr[-500:]
    return cwd / name


def weights(cwd: Path, tensors: dict) -> Path:
    import torch
    from safetensors.torch import save_file

    base = {"embedding.weight": torch.randn(256, 64), "norm.weight": torch.ones(64),
            "fc1.weight": torch.randn(256, 64), "fc2.weight": torch.randn(256, 128)}
    base.update(tensors)
    save_file({k: v for k, v in base.items() if v is not None}, str(cwd / "w.safetensors"))
    return cwd / "w.safetensors"


def flip_tail(path: Path, n: int = 400) -> None:
    data = bytearray(path.read_bytes())
    for k in range(max(0, len(data) - n), len(data)):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- the cases: (class, name, setup(cwd) -> args, what "handled" is) ---------------------

def refused(done, cwd) -> bool:
    return done.returncode == 2 and "Traceback" not in done.stderr


def intact(*files):
    """Refused, and each (path relative to cwd, bytes before) still there as it was."""
    def check(done, cwd):
        return refused(done, cwd) and all((cwd / f).read_bytes() == b for f, b in files_of(cwd, files))
    return check


_SNAPSHOTS: dict[str, bytes] = {}


def files_of(cwd, names):
    return [(n, _SNAPSHOTS[str(cwd / n)]) for n in names]


def snap(cwd: Path, *names: str) -> None:
    for n in names:
        _SNAPSHOTS[str(cwd / n)] = (cwd / n).read_bytes()


def resume(*flags):
    return [*RUN[:1], "--no-progress", "--max-steps", "6", "--resume", "ck", *flags]


CASES = []


def case(cls: str, name: str, handled=refused):
    def register(setup):
        CASES.append((cls, name, setup, handled))
        return setup
    return register


# a directory ckparity writes is its own, or refused
@case("directories", "checkpoint dir holding the user's files", intact("mydata/notes.txt"))
def _(cwd):
    (cwd / "mydata").mkdir()
    (cwd / "mydata" / "notes.txt").write_text("mine")
    snap(cwd, "mydata/notes.txt")
    return [*RUN, "--checkpoint-every", "2", "--checkpoint-dir", "mydata"]


@case("directories", "checkpoint dir holding a user's step-by-step-notes/", intact("mydata/step-by-step-notes/a.txt"))
def _(cwd):
    (cwd / "mydata" / "step-by-step-notes").mkdir(parents=True)
    (cwd / "mydata" / "step-by-step-notes" / "a.txt").write_text("mine")
    snap(cwd, "mydata/step-by-step-notes/a.txt")
    return [*RUN, "--checkpoint-every", "2", "--checkpoint-dir", "mydata"]


@case("directories", "a fresh run into another run's checkpoint dir", intact("ck/latest"))
def _(cwd):
    checkpoint(cwd)
    snap(cwd, "ck/latest")
    return [*RUN, *CKPT, "--seed", "7"]


@case("directories", "the default checkpoint dir, a second fresh run", intact("reports/checkpoint/latest"))
def _(cwd):
    assert ckparity(cwd, *RUN, "--checkpoint-every", "2").returncode == 0
    snap(cwd, "reports/checkpoint/latest")
    return [*RUN, "--checkpoint-every", "2", "--seed", "9"]


@case("directories", "checkpoint dir that is a file")
def _(cwd):
    (cwd / "ck").write_text("x")
    return [*RUN, *CKPT]


@case("directories", "dump dir = a checkpoint's step dir", intact("ck/step-000000004/tensors.safetensors"))
def _(cwd):
    checkpoint(cwd)
    snap(cwd, "ck/step-000000004/tensors.safetensors")
    return [*RUN, "--dump-step", "2", "--dump-dir", "ck/step-000000004"]


@case("directories", "dump dir = a checkpoint dir", intact("ck/latest"))
def _(cwd):
    checkpoint(cwd)
    snap(cwd, "ck/latest")
    return [*RUN, "--dump-step", "2", "--dump-dir", "ck"]


@case("directories", "dump dir holding the user's files", intact("mine/a.txt"))
def _(cwd):
    (cwd / "mine").mkdir()
    (cwd / "mine" / "a.txt").write_text("mine")
    snap(cwd, "mine/a.txt")
    return [*RUN, "--dump-step", "2", "--dump-dir", "mine"]


@case("directories", "checkpoint dir = a dump dir", intact("d/dump.json"))
def _(cwd):
    dump(cwd)
    snap(cwd, "d/dump.json")
    return [*RUN, "--checkpoint-every", "2", "--checkpoint-dir", "d"]


@case("directories", "dump dir that is a file")
def _(cwd):
    (cwd / "d").write_text("x")
    return [*RUN, "--dump-step", "2", "--dump-dir", "d"]


@case("directories", "--overwrite-checkpoints without --checkpoint-every")
def _(cwd):
    return [*RUN, "--overwrite-checkpoints"]


# a resume honours every flag given, or refuses
for flag, value, base in (("--model", "tiny", ["--model", "stacked"]), ("--seed", "42", ["--seed", "7"]),
                          ("--lr", "0.002", []), ("--vocab", "128", []), ("--grad-accum", "1", ["--grad-accum", "2"]),
                          ("--optimizer", "sgd", []), ("--label-smoothing", "0.1", [])):
    @case("resume", f"resume {flag} {value} on a checkpoint with another")
    def _(cwd, base=base, flag=flag, value=value):
        checkpoint(cwd, *base)
        return resume(flag, value)


@case("resume", "resume with another --train-text path")
def _(cwd):
    (cwd / "a.txt").write_text("hello world " * 50)
    (cwd / "b.txt").write_text("other text " * 50)
    checkpoint(cwd, "--train-text", "a.txt")
    return resume("--train-text", "b.txt")


@case("resume", "resume after the --train-text file changed")
def _(cwd):
    (cwd / "a.txt").write_text("hello world " * 50)
    checkpoint(cwd, "--train-text", "a.txt")
    (cwd / "a.txt").write_text("changed text " * 50)
    return resume()


@case("resume", "resume without --checkpoint-every goes on checkpointing",
      lambda done, cwd: done.returncode == 0 and (cwd / "ck" / "latest").read_text() == "step-000000006")
def _(cwd):
    checkpoint(cwd)
    return resume()


for key, value in (("cpu_capability", "SOMETHING_ELSE"), ("torch", "2.0.0"), ("ckparity", "0.0.1")):
    @case("resume", f"resume of a checkpoint written with another {key}")
    def _(cwd, key=key, value=value):
        checkpoint(cwd)
        if not (step_dir(cwd) / "checkpoint.json").read_text().count('"environment"'):
            return resume()  # a ckparity that records no environment cannot refuse it
        edit_manifest(cwd, lambda m: m["environment"].__setitem__(key, value))
        return resume()


@case("resume", "resume of a directory that does not exist")
def _(cwd):
    return resume()


@case("resume", "resume of an empty directory")
def _(cwd):
    (cwd / "ck").mkdir()
    return resume()


@case("resume", "resume of a dump directory")
def _(cwd):
    dump(cwd, "ck")
    return resume()


@case("resume", "resume with --max-steps before the checkpoint's step")
def _(cwd):
    checkpoint(cwd)
    return [*RUN[:1], "--no-progress", "--max-steps", "2", "--resume", "ck"]


# a broken checkpoint is an input error naming the file
for what, damage in (
        ("flipped bytes in its tensors", lambda cwd: flip_tail(step_dir(cwd) / "tensors.safetensors")),
        ("truncated tensors", lambda cwd: (step_dir(cwd) / "tensors.safetensors").write_bytes(
            (step_dir(cwd) / "tensors.safetensors").read_bytes()[:1000])),
        ("an empty tensors file", lambda cwd: (step_dir(cwd) / "tensors.safetensors").write_bytes(b"")),
        ("no tensors file", lambda cwd: (step_dir(cwd) / "tensors.safetensors").unlink()),
        ("an empty checkpoint.json", lambda cwd: (step_dir(cwd) / "checkpoint.json").write_text("")),
        ("a truncated checkpoint.json", lambda cwd: (step_dir(cwd) / "checkpoint.json").write_text(
            (step_dir(cwd) / "checkpoint.json").read_text()[:200])),
        ("a binary checkpoint.json", lambda cwd: (step_dir(cwd) / "checkpoint.json").write_bytes(bytes(range(256)))),
        ("another schema", lambda cwd: edit_manifest(cwd, lambda m: m.__setitem__("schema", "other/9"))),
        ("a step that is not its directory's", lambda cwd: edit_manifest(cwd, lambda m: m.__setitem__("step", 3))),
        ("an unknown config key", lambda cwd: edit_manifest(cwd, lambda m: m["config"].__setitem__("warp", 9))),
        ("another model's dims", lambda cwd: edit_manifest(cwd, lambda m: m["config"].__setitem__("d_model", 32))),
        ("a config value of the wrong type", lambda cwd: edit_manifest(
            cwd, lambda m: m["config"].__setitem__("d_model", "64"))),
        ("no state in its manifest", lambda cwd: edit_manifest(cwd, lambda m: m.pop("state"))),
        ("latest naming ../elsewhere/step-N", lambda cwd: (cwd / "ck" / "latest").write_text(
            "../elsewhere/step-000000004")),
        ("latest naming a step that is not there", lambda cwd: (cwd / "ck" / "latest").write_text("step-000000099")),
        ("an empty latest", lambda cwd: (cwd / "ck" / "latest").write_text("")),
        ("latest a directory", lambda cwd: ((cwd / "ck" / "latest").unlink(), (cwd / "ck" / "latest").mkdir())),
):
    @case("corrupt checkpoint", f"resume of a checkpoint with {what}")
    def _(cwd, damage=damage):
        checkpoint(cwd)
        damage(cwd)
        return resume()


@case("corrupt checkpoint", "latest a link to a file of the user's", intact("victim.txt"))
def _(cwd):
    checkpoint(cwd)
    (cwd / "victim.txt").write_text("precious")
    snap(cwd, "victim.txt")
    (cwd / "ck" / "latest").unlink()
    (cwd / "ck" / "latest").symlink_to(cwd / "victim.txt")
    return resume()


# step dumps
@case("dumps", "replay of a directory without dump.json")
def _(cwd):
    (cwd / "d").mkdir()
    return ["replay", "d"]


for what, damage in (
        ("an empty dump.json", lambda d: (d / "dump.json").write_text("")),
        ("another schema", lambda d: (d / "dump.json").write_text(json.dumps({"schema": "x/1"}))),
        ("no tensors file", lambda d: (d / "tensors.safetensors").unlink()),
        ("truncated tensors", lambda d: (d / "tensors.safetensors").write_bytes(
            (d / "tensors.safetensors").read_bytes()[:500])),
        ("an unknown config key", lambda d: (d / "dump.json").write_text(json.dumps(
            {**json.loads((d / "dump.json").read_text()),
             "config": {**json.loads((d / "dump.json").read_text())["config"], "warp": 9}}))),
):
    @case("dumps", f"replay of a dump with {what}")
    def _(cwd, damage=damage):
        damage(dump(cwd))
        return ["replay", "d"]


@case("dumps", "replay of a dump.json with another dump's tensors")
def _(cwd):
    a, b = dump(cwd, "d", 2), dump(cwd, "e", 3)
    (a / "tensors.safetensors").write_bytes((b / "tensors.safetensors").read_bytes())
    return ["replay", "d"]


@case("dumps", "dump.json a link to a file of the user's",
      lambda done, cwd: done.returncode == 0 and (cwd / "victim.txt").read_text() == "precious")
def _(cwd):
    d = dump(cwd)
    (cwd / "victim.txt").write_text("precious")
    (d / "dump.json").unlink()
    (d / "dump.json").symlink_to(cwd / "victim.txt")
    return [*RUN, "--dump-step", "2", "--dump-dir", "d"]


# --init-from
for what, tensors in (("NaN weights", {"embedding.weight": "nan"}), ("an inf weight", {"fc1.weight": "inf"}),
                      ("int64 weights", {"embedding.weight": "int64"}), ("bool weights", {"norm.weight": "bool"}),
                      ("a 1-D embedding", {"embedding.weight": "1d"}), ("an fc1 of the wrong shape", {"fc1.weight": "shape"}),
                      ("an extra tensor", {"extra.weight": "extra"}), ("a missing tensor", {"norm.weight": None})):
    @case("init-from", f"--init-from {what}")
    def _(cwd, tensors=tensors):
        import torch

        made = {}
        for name, kind in tensors.items():
            made[name] = {"nan": torch.full((256, 64), float("nan")), "inf": torch.full((256, 64), float("inf")),
                          "int64": torch.ones(256, 64, dtype=torch.int64), "bool": torch.ones(64, dtype=torch.bool),
                          "1d": torch.ones(256), "shape": torch.randn(100, 64), "extra": torch.ones(3),
                          None: None}[kind]
        weights(cwd, made)
        return [*RUN, "--init-from", "w.safetensors"]


@case("init-from", "--init-from a file that does not exist")
def _(cwd):
    return [*RUN, "--init-from", "nope.safetensors"]


@case("init-from", "--init-from a text file named .pt")
def _(cwd):
    (cwd / "w.pt").write_text("not a checkpoint")
    return [*RUN, "--init-from", "w.pt"]


@case("init-from", "--init-from a truncated safetensors")
def _(cwd):
    path = weights(cwd, {})
    path.write_bytes(path.read_bytes()[:300])
    return [*RUN, "--init-from", "w.safetensors"]


@case("init-from", "--init-from a directory that is not a checkpoint")
def _(cwd):
    (cwd / "wd").mkdir()
    return [*RUN, "--init-from", "wd"]


# plugins and the gates' config
for what, body in (("calls sys.exit", "import sys\nsys.exit(3)\n"), ("raises at import", "raise RuntimeError('x')\n"),
                   ("imports a missing module", "import no_such_module_anywhere\n")):
    @case("plugins", f"a plugin that {what}")
    def _(cwd, body=body):
        (cwd / "p.py").write_text(body)
        return ["info", "--plugin", "p.py"]


@case("plugins", "a plugin file that does not exist")
def _(cwd):
    return ["info", "--plugin", "nope.py"]


for what, text in (("a value of the wrong kind", '[long_horizon]\nsteps = "ten"\n'),
                   ("an unknown key", "[long_horizon]\nstepz = 3\n"), ("broken TOML", "[long_horizon\nsteps = 3\n"),
                   ("an unknown gate", "[no_such_gate]\nsteps = 3\n")):
    @case("gates config", f"gates --config with {what}")
    def _(cwd, text=text):
        (cwd / "g.toml").write_text(text)
        return ["gate", "--config", "g.toml", "--only", "fd_gradients", "--out-dir", "gates"]


def run_case(cls, name, setup, handled) -> dict:
    cwd = Path(tempfile.mkdtemp(prefix="ckparity-bad-input-"))
    try:
        args = setup(cwd)
        done = ckparity(cwd, *args)
        outcome = ("handled" if handled(done, cwd) else
                   "traceback" if "Traceback (most recent call last)" in done.stderr else "mishandled")
        last = (done.stderr.strip().splitlines() or [""])[-1][:300]
        return {"class": cls, "case": name, "outcome": outcome, "exit": done.returncode, "says": last}
    except Exception as err:  # noqa: BLE001 -- a case whose set-up fails is reported, not fatal
        return {"class": cls, "case": name, "outcome": "setup failed", "exit": None,
                "says": f"{type(err).__name__}: {err}"[:300]}
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-out", required=True)
    parser.add_argument("-k", default="", help="only the cases whose name holds this")
    args = parser.parse_args()
    rows = [run_case(*c) for c in CASES if args.k in c[1]]
    for r in rows:
        print(f"{r['outcome']:12s} {r['class']:18s} {r['case']}  [{r['exit']}] {r['says'][:120]}", flush=True)
    totals = {o: sum(r["outcome"] == o for r in rows) for o in ("handled", "traceback", "mishandled", "setup failed")}
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"schema": "ckparity.bad_inputs/1", "python": sys.executable, "cases": len(rows),
                               "totals": totals, "rows": rows}, indent=1) + "\n")
    print(totals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
