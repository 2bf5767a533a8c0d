"""`ckparity check --plugin engine.py` with no kernel: every backend the plugin registers checked in its own
child and timed against torch eager, one table and one quotable line (correct; correct and faster:
fast_1), the engine's JSON report, and JUnit XML from check and gate, read back as CI tools read it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from ckparity import kernels
from ckparity.check import engine
from ckparity.check.rule import check_passes, gate_passes
from ckparity.cli import main

_ENGINE = """
import ctypes
import torch
import ckparity


def residual(x, y):  # the same IEEE sum as torch's add, without torch's add
    return torch.sub(x, torch.neg(y))


def residual_off(x, y):  # wrong: a bias slipped in
    return torch.sub(x, torch.neg(y)) + 1e-2


def swiglu_segfaults(x):  # a C crash on every call past the contract's
    if x.numel() > 16:
        ctypes.string_at(0)
    return ckparity.swiglu(x)


ckparity.register_backend("residual", "engine", residual)
ckparity.register_backend("residual", "engine_off", residual_off)
ckparity.register_backend("swiglu", "engine", swiglu_segfaults)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CKP_PLUGINS", "")  # what --plugin adds to it ends with the test
    (tmp_path / "engine.py").write_text(_ENGINE)
    return "engine.py"


def _junit(path):
    """The XML as a JUnit reader takes it: the suite's counts, and (classname, name, failed) per case."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuite"
    cases = [(c.get("classname"), c.get("name"), c.find("failure") is not None) for c in root.iter("testcase")]
    assert int(root.get("tests")) == len(cases) and int(root.get("failures")) == sum(f for *_, f in cases)
    return cases


def test_the_engine_table_line_json_and_junit(plugin, tmp_path, capsys):
    out, xml = tmp_path / "engine.json", tmp_path / "engine.xml"
    assert main(["check", "--plugin", plugin, "--json-out", str(out), "--junit", str(xml)]) == 1  # wrong, crashes
    report = json.loads(out.read_text())
    assert report["schema"] == engine.SCHEMA and report["slots"] == 3
    rows = {(r["kernel"], r["backend"]): r for r in report["rows"]}
    assert set(rows) == {("residual", "engine"), ("residual", "engine_off"), ("swiglu", "engine")}
    assert rows[("residual", "engine")]["verdict"] == "bitwise" and rows[("residual", "engine")]["bit_identical"] == 1
    assert rows[("residual", "engine_off")]["verdict"] == "wrong"
    assert rows[("swiglu", "engine")]["verdict"] == "crashes"
    honest = rows[("residual", "engine")]
    assert honest["speedup"] > 0 and "x (256, 4096)" in honest["speed_shape"]  # timed at the realistic shape
    assert rows[("residual", "engine_off")]["speedup"] is None  # a wrong kernel is not timed
    # the counts are the rows' (correct: a verdict a gate passes; faster: above 1x torch eager)
    assert report["correct"] == 1 == sum(gate_passes(r["verdict"]) for r in report["rows"])
    assert report["correct_and_faster"] == (honest["speedup"] > 1)
    assert report["line"].startswith("1 of 3 slots correct") and f"fast_1 = {report['fast_1']:.2f}" in report["line"]
    table = capsys.readouterr().out
    assert report["line"] in table and "| residual | engine_off | wrong |" in table
    # JUnit: a case per property of each slot's check, failing where check fails it
    cases = _junit(xml)
    properties = [(f"ckparity.check.{c['kernel']}.{c['backend']}", p["property"], not check_passes(p["verdict"]))
                  for c in report["checks"] for p in c["properties"]]
    assert cases == properties and any(f for *_, f in cases) and not all(f for *_, f in cases)
    assert ("ckparity.check.residual.engine", "cheats", False) in cases


def test_all_checks_ckparitys_own_and_a_bare_engine_is_refused(plugin, capsys, monkeypatch):
    assert main(["check"]) == 2  # no plugin registers anything
    assert "no backend to check" in capsys.readouterr().err
    assert main(["check", "--backend", "c"]) == 2  # a backend without its kernel
    assert main(["check", "swiglu"]) == 2  # a kernel without a backend
    pairs = engine.backends_to_check(every=True)
    assert ("linear", "c") in pairs and ("cross_entropy", "c_ptref") in pairs
    assert not any(b == "torch" for _, b in pairs)


def test_a_single_check_writes_junit_too(plugin, tmp_path):
    xml = tmp_path / "check.xml"
    assert main(["check", "residual", "--plugin", plugin, "--backend", "engine_off", "--junit", str(xml)]) == 1
    cases = _junit(xml)
    assert ("ckparity.check.residual.engine_off", "widths", True) in cases
    timed = {c.get("name"): float(c.get("time")) for c in ET.parse(xml).getroot().iter("testcase")}
    assert timed["widths"] > 0 and timed["cheats"] > 0  # each property's own time, as CI pages show it


def test_gate_junit_has_a_case_per_gate_failing_where_the_gate_fails(plugin, tmp_path, monkeypatch):
    """(the gates load plugins in this process: the engine without its segfaulting backend)"""
    monkeypatch.setattr(kernels.KERNELS["residual"], "backends", dict(kernels.backends("residual")))
    monkeypatch.setattr(kernels.registry, "_loaded", [])
    (tmp_path / "residuals.py").write_text(_ENGINE.replace('ckparity.register_backend("swiglu"', "# "))
    xml, page = tmp_path / "gate.xml", tmp_path / "gate.html"
    code = main(["gate", "--plugin", "residuals.py", "--only", "kernel_parity", "--backend", "residual=engine_off",
                 "--out-dir", str(tmp_path / "gates"), "--junit", str(xml), "--html", str(page)])
    assert code == 1
    assert _junit(xml) == [("ckparity.gate.quick", "kernel_parity", True)]
    root = ET.parse(xml).getroot()
    assert "residual backend 'engine_off'" in root.find("testcase/failure").get("message")
    text = page.read_text()  # the page's table: the gate, and its result as the summary says it
    assert '<p class="fail">0 of 1 gates passed</p>' in text and "<td>kernel_parity</td><td><strong>FAIL</strong></td>" in text
