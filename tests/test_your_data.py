"""Long runs and the user's data: a directory ckparity writes is its own or
refused, a resume honours every flag given or refuses, and a broken or
foreign file is an input error that names it (exit 2) -- never data lost,
never a silently other run, never a parity verdict on bit rot.

Each test is one bad input a user met (issue 35's list), in process through
``ckparity.cli.main`` (its exit codes), on the tiny model's few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckparity.cli import main
from ckparity.harness.longrun import checkpoint
from ckparity.harness.basics.config import RunConfig

RUN = ["train", "--max-steps", "4", "--no-progress"]


def _run(tmp_path, *flags) -> int:
    return main([*RUN, "--json-out", str(tmp_path / "r.json"), *flags])


def _checkpointed(tmp_path, name="ck", *flags) -> Path:
    ck = tmp_path / name
    assert _run(tmp_path, "--checkpoint-every", "2", "--checkpoint-dir", str(ck), *flags) == 0
    return ck


# ---- a directory is ckparity's or refused ------------------------------------

def test_a_directory_of_the_users_files_is_refused_and_kept(tmp_path, capsys):
    notes = tmp_path / "mydata" / "step-by-step-notes"
    notes.mkdir(parents=True)
    (notes / "day1.txt").write_text("mine")
    assert _run(tmp_path, "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "mydata")) == 2
    assert "not ckparity's checkpoints" in capsys.readouterr().err
    assert (notes / "day1.txt").read_text() == "mine"
    # nor with the flag that lets a run start over in a checkpoint directory of another run
    assert _run(tmp_path, "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "mydata"),
                "--overwrite-checkpoints") == 2
    assert (notes / "day1.txt").read_text() == "mine"


def test_another_runs_checkpoints_are_refused_then_replaced_only_when_asked(tmp_path, capsys):
    ck = _checkpointed(tmp_path)
    before = (ck / "latest").read_text()
    assert _run(tmp_path, "--checkpoint-every", "2", "--checkpoint-dir", str(ck), "--seed", "7") == 2
    assert "holds the checkpoints of another run" in capsys.readouterr().err
    assert (ck / "latest").read_text() == before
    assert _run(tmp_path, "--checkpoint-every", "3", "--checkpoint-dir", str(ck), "--seed", "7",
                "--overwrite-checkpoints") == 0
    assert (ck / "latest").read_text() == "step-000000003"  # the new run's, the old steps gone
    assert sorted(p.name for p in ck.iterdir()) == ["ckparity-run.json", "latest", "step-000000003"]


def test_a_dump_never_goes_into_a_checkpoint(tmp_path, capsys):
    ck = _checkpointed(tmp_path)
    step = ck / "step-000000004"
    tensors = (step / "tensors.safetensors").read_bytes()
    for target in (step, ck):
        assert _run(tmp_path, "--dump-step", "2", "--dump-dir", str(target)) == 2
        assert "holds other files than a step dump's" in capsys.readouterr().err
    assert (step / "tensors.safetensors").read_bytes() == tensors


def test_a_checkpoint_never_goes_into_a_dump(tmp_path, capsys):
    assert _run(tmp_path, "--dump-step", "2", "--dump-dir", str(tmp_path / "d")) == 0
    assert _run(tmp_path, "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "d")) == 2
    assert "not ckparity's checkpoints" in capsys.readouterr().err


def test_links_planted_at_the_names_ckparity_writes_are_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    ck = _checkpointed(tmp_path)
    (ck / "latest").unlink()
    (ck / "latest").symlink_to(victim)
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck), "--json-out", str(tmp_path / "r2.json")]) == 2
    (ck / "latest").unlink()
    (ck / "latest").write_text("step-000000004")
    d = tmp_path / "d"
    assert _run(tmp_path, "--dump-step", "2", "--dump-dir", str(d)) == 0
    (d / "dump.json").unlink()
    (d / "dump.json").symlink_to(victim)
    assert _run(tmp_path, "--dump-step", "2", "--dump-dir", str(d)) == 0
    assert victim.read_text() == "precious" and not (d / "dump.json").is_symlink()


def test_a_killed_writes_leftovers_are_cleaned_by_the_next_save(tmp_path):
    ck = _checkpointed(tmp_path)
    leftover = ck / ".ckparity-halfway"
    leftover.mkdir()
    (leftover / "tensors.safetensors").write_bytes(b"partial")
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck), "--json-out", str(tmp_path / "r2.json")]) == 0
    assert not leftover.exists() and (ck / "latest").read_text() == "step-000000006"


# ---- a resume honours or refuses ------------------------------------------------

def test_a_flag_given_with_its_default_value_is_compared_on_resume(tmp_path, capsys):
    ck = _checkpointed(tmp_path, "ck", "--model", "stacked", "--seed", "7")
    for flag, value in (("--model", "tiny"), ("--seed", "42"), ("--lr", "0.001")):
        code = main([*RUN, "--max-steps", "6", "--resume", str(ck), flag, value])
        err = capsys.readouterr().err
        if flag == "--lr":  # the checkpoint's lr is 0.001 too: the same value is no conflict
            assert code == 0
        else:
            assert code == 2 and f"{flag} " in err and "differs from the checkpoint's" in err


def test_a_resume_goes_on_checkpointing_with_the_checkpoints_settings(tmp_path):
    ck = _checkpointed(tmp_path)
    assert main([*RUN, "--max-steps", "8", "--resume", str(ck), "--json-out", str(tmp_path / "r2.json")]) == 0
    assert (ck / "latest").read_text() == "step-000000008"


def test_a_resume_in_another_environment_is_refused(tmp_path, capsys):
    ck = _checkpointed(tmp_path)
    manifest_path = ck / "step-000000004" / "checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    other = {"DEFAULT": "AVX2"}.get(torch.backends.cpu.get_cpu_capability(), "DEFAULT")
    manifest["environment"]["cpu_capability"] = other
    manifest_path.write_text(json.dumps(manifest))
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2
    err = capsys.readouterr().err
    assert "another environment" in err and other in err


# ---- every file read is validated before the work --------------------------------

def _corrupt_tensors(ck: Path) -> None:
    data = bytearray((ck / "step-000000004" / "tensors.safetensors").read_bytes())
    for k in range(len(data) - 400, len(data)):
        data[k] ^= 0xFF
    (ck / "step-000000004" / "tensors.safetensors").write_bytes(bytes(data))


@pytest.mark.parametrize("damage, says", [
    (_corrupt_tensors, "SHA-256 is not the one"),
    (lambda ck: (ck / "step-000000004" / "checkpoint.json").write_text(""), "not a readable checkpoint manifest"),
    (lambda ck: (ck / "step-000000004" / "checkpoint.json").write_text('{"schema": "ckparity.checkpoint/1", "st'),
     "not a readable checkpoint manifest"),
    (lambda ck: (ck / "step-000000004" / "tensors.safetensors").unlink(), "no tensors.safetensors"),
    (lambda ck: (ck / "latest").write_text("../elsewhere/step-000000004"), "not a step of this directory"),
    (lambda ck: [(ck / "step-000000004").rename(ck / "step-000000003"), (ck / "latest").write_text("step-000000003")],
     "says step 4, its directory is step-000000003"),
])
def test_a_broken_checkpoint_is_an_input_error_naming_the_file(tmp_path, capsys, damage, says):
    ck = _checkpointed(tmp_path)
    damage(ck)
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("key, value, says", [("warp_factor", 9, "config keys this ckparity does not know: warp_factor"),
                                              ("d_model", "64", "config d_model = '64' is not a int"),
                                              ("lr", -1.0, "its config: --lr must be finite and > 0")])
def test_a_config_this_ckparity_cannot_take_is_refused(tmp_path, capsys, key, value, says):
    ck = _checkpointed(tmp_path)
    path = ck / "step-000000004" / "checkpoint.json"
    manifest = json.loads(path.read_text())
    manifest["config"][key] = value
    path.write_text(json.dumps(manifest))
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2
    assert says in capsys.readouterr().err


def test_a_config_key_the_manifest_lacks_is_refused_by_name(tmp_path, capsys):
    """A manifest without adamw_beta1 (hand-edited, or truncated) would resume with the default beta1,
    which the run may not have had: refused by name. A field its config_version predates (torch_threads,
    added in version 2) means the default, which that ckparity ran with: resumed."""
    ck = _checkpointed(tmp_path)
    path = ck / "step-000000004" / "checkpoint.json"
    manifest = json.loads(path.read_text())
    assert manifest["config_version"] == checkpoint.CONFIG_VERSION
    del manifest["config"]["adamw_beta1"]
    path.write_text(json.dumps(manifest))
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2
    assert "its config lacks adamw_beta1" in capsys.readouterr().err
    manifest = json.loads(path.read_text())
    manifest["config"]["adamw_beta1"] = 0.9
    del manifest["config"]["torch_threads"]
    path.write_text(json.dumps(manifest))
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2  # version 2 holds torch_threads
    assert "its config lacks torch_threads" in capsys.readouterr().err
    del manifest["config_version"]  # a manifest from before config_version: version 1, torch_threads unknown
    path.write_text(json.dumps(manifest))
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 0


def test_a_dump_with_another_dumps_tensors_is_refused(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert _run(tmp_path, "--dump-step", "2", "--dump-dir", str(a)) == 0
    assert _run(tmp_path, "--dump-step", "3", "--dump-dir", str(b)) == 0
    (a / "tensors.safetensors").write_bytes((b / "tensors.safetensors").read_bytes())
    assert main(["replay", str(a)]) == 2
    assert "not the tensors its dump.json recorded" in capsys.readouterr().err


def test_the_checkpoint_records_what_a_resume_verifies(tmp_path):
    ck = _checkpointed(tmp_path)
    manifest = json.loads((ck / "step-000000004" / "checkpoint.json").read_text())
    assert manifest["environment"] == checkpoint.environment(RunConfig())  # the run set no --threads
    assert len(manifest["tensors_sha256"]) == 64
    marker = json.loads((ck / "ckparity-run.json").read_text())
    assert marker["schema"] == "ckparity.checkpoint-dir/1" and marker["run"]


# ---- --init-from: refused by name, before any conversion ------------------------------

@pytest.mark.parametrize("tensor, says", [
    (torch.full((256, 64), float("nan")), "non-finite"),
    (torch.ones(256, 64).index_put_((torch.tensor([3]), torch.tensor([5])), torch.tensor(float("inf"))), "non-finite"),
    (torch.ones(256, 64, dtype=torch.int64), "I64, not a floating-point weight"),
    (torch.ones(256, 64, dtype=torch.bool), "BOOL, not a floating-point weight"),
    (torch.ones(256), "not (vocab, d-model)"),
])
def test_init_from_weights_that_cannot_start_a_run_are_refused(tmp_path, capsys, tensor, says):
    from safetensors.torch import save_file

    save_file({"embedding.weight": tensor}, str(tmp_path / "w.safetensors"))
    assert _run(tmp_path, "--init-from", str(tmp_path / "w.safetensors")) == 2
    err = capsys.readouterr().err
    assert says in err and "embedding.weight" in err


def test_a_resume_on_a_changed_train_text_is_refused(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 20)
    ck = _checkpointed(tmp_path, "ck", "--train-text", str(text))
    text.write_text("a different corpus altogether, of about the same size " * 16)
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2
    assert "is not the file the run trained on" in capsys.readouterr().err


def test_a_checkpoint_whose_tensors_do_not_fit_its_config_is_refused(tmp_path, capsys):
    ck = _checkpointed(tmp_path)
    path = ck / "step-000000004" / "checkpoint.json"
    manifest = json.loads(path.read_text())
    manifest["config"]["d_model"] = 32  # another model's dims, the tensors unchanged
    path.write_text(json.dumps(manifest))
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2
    assert "does not fit the run its config describes" in capsys.readouterr().err


# ---- plugins and check: a user's code fails as an input error, and its prints are its own -------

@pytest.mark.parametrize("body, says", [
    ("import sys\nsys.exit(3)\n", "failed to load: sys.exit(3)"),
    ("raise RuntimeError('boom at import')\n", "failed to load: RuntimeError: boom at import"),
    ("import no_such_module_anywhere\n", "failed to load: ModuleNotFoundError"),
])
def test_a_plugin_that_fails_at_import_is_exit_2_naming_it(tmp_path, capsys, monkeypatch, body, says):
    monkeypatch.setenv("CKP_PLUGINS", "")
    (tmp_path / "bad_plugin.py").write_text(body)
    assert main(["info", "--plugin", str(tmp_path / "bad_plugin.py")]) == 2
    err = capsys.readouterr().err
    assert "bad_plugin.py" in err and says in err


_PRINTING_PLUGIN = '''
import ckparity, torch.nn.functional as F
def loud(x):
    h = x.shape[-1] // 2
    print('{"verdict": "bitwise"} from the backend')
    return F.silu(x[..., :h]) * x[..., h:]
ckparity.register_backend("swiglu", "loud", loud)
'''

_HANGING_PLUGIN = '''
import os, pathlib, time, ckparity, torch.nn.functional as F
def slow(x):
    h = x.shape[-1] // 2
    if x.shape[-1] > 100:  # past the contract check's call: the suite's widths
        if os.environ.get("HANG_MARK"):
            pathlib.Path(os.environ["HANG_MARK"]).touch()  # says the hang began
        time.sleep(3600)
    return F.silu(x[..., :h]) * x[..., h:]
ckparity.register_backend("swiglu", "slow", slow)
'''


def _load_plugin(tmp_path, monkeypatch, body: str) -> None:
    """A plugin file loaded here and named to check's child (CKP_PLUGINS); its swiglu registrations end with the test."""
    from ckparity import kernels

    path = tmp_path / "plugin.py"
    path.write_text(body)
    monkeypatch.setenv("CKP_PLUGINS", str(path))
    monkeypatch.setattr(kernels.KERNELS["swiglu"], "backends", dict(kernels.backends("swiglu")))
    kernels.load_plugin(str(path))


def test_check_reads_its_report_whatever_the_backend_prints(tmp_path, monkeypatch):
    from ckparity import check

    _load_plugin(tmp_path, monkeypatch, _PRINTING_PLUGIN)
    report = check.isolated_check("swiglu", "loud", timeout=600)
    assert report["verdict"] in ("bitwise", "as accurate as torch") and "crash" not in report


def test_a_check_past_its_timeout_is_crashes_naming_the_case(tmp_path, monkeypatch):
    from ckparity import check

    _load_plugin(tmp_path, monkeypatch, _HANGING_PLUGIN)
    report = check.isolated_check("swiglu", "slow", timeout=12)
    assert report["verdict"] == "crashes" and "--timeout of 12 s" in report["crash"]["ending"]
    assert report["crash"]["property"] == "widths" and report["crash"]["case"].startswith("width=")


def test_a_gates_config_value_of_the_wrong_kind_is_refused(tmp_path):
    from ckparity import gates

    (tmp_path / "g.toml").write_text('[long_horizon]\nsteps = "ten"\n')
    with pytest.raises(ValueError, match=r"steps = 'ten' is a str, the setting takes a int"):
        gates.settings_for("quick", str(tmp_path / "g.toml"))
    (tmp_path / "g.toml").write_text('[accuracy_parity]\nfactor = 3\n')  # an int where a float is: fine
    assert gates.settings_for("quick", str(tmp_path / "g.toml"))["accuracy_parity"]["factor"] == 3


def test_the_report_says_what_a_resume_changed(tmp_path):
    ck = _checkpointed(tmp_path)
    out = tmp_path / "resumed.json"
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck), "--json-out", str(out)]) == 0
    resumed = json.loads(out.read_text())["resume"]
    assert resumed["directory"] == str(ck) and resumed["step"] == 4
    assert resumed["changed"] == {"max_steps": [4, 6], "json_out": [str(tmp_path / "r.json"), str(out)]}
    assert json.loads((tmp_path / "r.json").read_text())["resume"] is None


def test_a_resume_at_another_torch_thread_count_is_refused(tmp_path, capsys):
    ck = _checkpointed(tmp_path, "ck", "--threads", "1")
    path = ck / "step-000000004" / "checkpoint.json"
    manifest = json.loads(path.read_text())
    assert manifest["environment"]["torch_threads"] == 1
    manifest["environment"]["torch_threads"] = 3  # as if written with torch on 3 threads
    path.write_text(json.dumps(manifest))
    assert main([*RUN, "--max-steps", "6", "--resume", str(ck)]) == 2
    assert "torch_threads 3 then, 1 now" in capsys.readouterr().err


def test_a_sigterm_to_check_ends_its_child_and_leaves_the_report_of_what_ran(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "slow.py").write_text(_HANGING_PLUGIN)
    out, mark = tmp_path / "check.json", tmp_path / "hanging"
    proc = subprocess.Popen([sys.executable, "-m", "ckparity", "check", "swiglu", "--plugin", "slow.py", "--backend",
                             "slow", "--json-out", str(out), "--junit", str(tmp_path / "check.xml")], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "CKP_PLUGINS": "", "HANG_MARK": str(mark)})
    deadline = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < deadline:  # the suite running, into the widths that hang
        time.sleep(0.05)
    children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    report = json.loads(out.read_text())
    assert report["verdict"] == "interrupted" and not report["passed"]
    assert report["crash"]["ending"] == "stopped by SIGTERM (killed)" and report["crash"]["property"] == "widths"
    import xml.etree.ElementTree as ET  # the JUnit of what ran: the interrupted property a failing case
    failing = [c.get("name") for c in ET.parse(tmp_path / "check.xml").getroot().iter("testcase")
               if c.find("failure") is not None]
    assert "widths" in failing
    assert not Path(f"/proc/{children[0]}").exists() or "Z" in Path(f"/proc/{children[0]}/stat").read_text().split()[2]
