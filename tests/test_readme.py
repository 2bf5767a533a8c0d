"""The front page says what is true: its Python examples run, its links lead
to pages that exist, and every docs page is on it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 2  # the ten-line example and the plugin's three lines
    for block in blocks:  # each in a fresh process: the plugin's registration must not leak into other tests
        done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{block}\n{done.stderr[-2000:]}"


def test_links_lead_somewhere_and_every_page_is_linked():
    linked = {m.split("#")[0] for m in re.findall(r"\]\(([^)]+)\)", README) if not m.startswith("http")}
    for target in linked:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def test_the_front_page_stays_a_front_page():
    assert len(README.splitlines()) <= 250
