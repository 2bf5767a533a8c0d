import json
import os
from pathlib import Path

import pytest
import torch

import ckparity
from parity import MEASUREMENTS, write_measurements

REPORTS = Path(__file__).resolve().parent.parent / "reports"

pytest_plugins = ["pytester"]  # test_check.py runs a user's test file against the installed pytest11 plugin


def pytest_configure(config):
    config.addinivalue_line("markers", "nightly: a longer case of a property a faster test checks in CI; runs with "
                                       "CKP_NIGHTLY=1 (scripts/nightly.sh)")


NIGHTLY_SH = (Path(__file__).resolve().parent.parent / "scripts" / "nightly.sh").read_text()


def pytest_collection_modifyitems(config, items):
    """The nightly tier's tests are skipped, visibly, unless CKP_NIGHTLY=1: CI
    stays under 10 minutes. Each must be named in scripts/nightly.sh, with the
    CI test that covers its property: a nightly test it does not name is an error."""
    nightly = [item for item in items if "nightly" in item.keywords]
    unnamed = sorted({item.originalname for item in nightly if item.originalname not in NIGHTLY_SH})
    if unnamed:
        raise pytest.UsageError(f"marked nightly but not named in scripts/nightly.sh: {', '.join(unnamed)}")
    if os.environ.get("CKP_NIGHTLY") == "1":
        return
    skip = pytest.mark.skip(reason="nightly tier: CKP_NIGHTLY=1 or scripts/nightly.sh runs it")
    for item in nightly:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fixed_threads_and_seed():
    """Every test starts from the same seed and leaves the thread count as it found it."""
    threads = ckparity.get_num_threads()
    torch.manual_seed(0)
    yield
    ckparity.set_num_threads(threads)


def pytest_sessionfinish(session):
    """Under pytest-xdist (scripts/test.sh runs the tests on every core) a
    worker's figures go to the controller, which writes the report."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["measurements"] = json.dumps(MEASUREMENTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: a worker has finished; its figures join the report's."""
    MEASUREMENTS.extend(json.loads(getattr(node, "workeroutput", {}).get("measurements", "[]")))


def pytest_terminal_summary(terminalreporter):
    """Worst figures per test family, and the full list in reports/parity_latest.json."""
    if not MEASUREMENTS:
        return
    write_measurements(REPORTS / "parity_latest.json")
    worst: dict[str, dict] = {}
    for m in MEASUREMENTS:
        if "ckparity_error64" not in m:
            continue
        family = m["name"].split("[")[0]
        w = worst.setdefault(family, {"max_ulp": 0, "ckparity_error64": 0.0, "torch_error64": 0.0, "count": 0})
        w["count"] += 1
        w["max_ulp"] = max(w["max_ulp"], m["max_ulp"])
        w["ckparity_error64"] = max(w["ckparity_error64"], m["ckparity_error64"])
        w["torch_error64"] = max(w["torch_error64"], m["torch_error64"])
    terminalreporter.section("parity figures (worst per family; all in reports/parity_latest.json)")
    for family, w in sorted(worst.items()):
        terminalreporter.line(
            f"{family:45s} n={w['count']:4d} max_ulp={w['max_ulp']:<8d} "
            f"err64 ckparity={w['ckparity_error64']:.3g} torch={w['torch_error64']:.3g}")
    bitwise: dict[str, list[int]] = {}
    for m in MEASUREMENTS:
        if "equal" in m:
            totals = bitwise.setdefault(m["name"], [0, 0, 0])
            totals[0] += m["equal"]
            totals[1] += m["total"]
            totals[2] = max(totals[2], m["max_ulp"])
    for name, (equal, total, ulp) in sorted(bitwise.items()):
        terminalreporter.line(f"{name:45s} {equal}/{total} bit-identical, max_ulp={ulp}")


@pytest.fixture
def clean_registry():
    """What a test registers (backends and their registrations) is gone after it."""
    from ckparity import kernels

    saved = {name: (dict(k.backends), dict(k.registrations)) for name, k in kernels.KERNELS.items()}
    yield
    for name, k in kernels.KERNELS.items():
        for table, before in zip((k.backends, k.registrations), saved[name]):
            table.clear()
            table.update(before)
