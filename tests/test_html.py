"""--html: one self-contained page (no network, the plot a PNG inside it) from train, compare, check and
gate, read back as a browser would: its plot decodes as a PNG, its numbers are the JSON's, its verdict
line says pass or fail as the report does; the forecast is said to be one."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser

from ckparity.cli import main
from ckparity.harness.basics.report import read_report

PNG = b"\x89PNG\r\n\x1a\n"


class _Page(HTMLParser):
    """The page's tables (rows of cell texts), images (src) and paragraphs (class, text); any external
    reference (a link, a script) is collected to be refused."""

    def __init__(self, text: str):
        super().__init__()
        self.tables, self.images, self.paragraphs, self.external = [], [], [], []
        self._cell = self._p = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "p":
            self._p = [attrs.get("class"), ""]
        if tag in ("script", "link") or any(str(v).startswith(("http:", "https:")) for v in attrs.values()):
            self.external.append(tag)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell)
            self._cell = None
        elif tag == "p":
            self.paragraphs.append(tuple(self._p))
            self._p = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._p is not None:
            self._p[1] += data

    def row(self, label: str) -> list[str]:
        return next(r[1:] for t in self.tables for r in t if r and r[0] == label)


def _read(path) -> _Page:
    page = _Page(path.read_text())
    assert not page.external  # self-contained
    return page


def test_train_writes_a_page_with_its_plot_and_its_first_fails(tmp_path):
    out, page_path = tmp_path / "run.json", tmp_path / "run.html"
    # a loss tolerance no run meets: the page must show the fail the report records
    code = main(["train", "--model", "tiny", "--max-steps", "8", "--total-tokens", "4096", "--seq-len", "16",
                 "--batch-size", "2", "--no-progress", "--loss-tol", "1e-12", "--ck-loss-backend", "c",
                 "--json-out", str(out), "--html", str(page_path)])
    report = read_report(out)
    assert code == 1 and report["status"] == "fail" and report["first_loss_fail_step"] is not None
    page = _read(page_path)
    [image] = page.images
    assert image.startswith("data:image/png;base64,") and base64.b64decode(image.split(",", 1)[1])[:8] == PNG
    [verdict] = [p for p in page.paragraphs if p[0] in ("pass", "fail")]
    assert verdict[0] == "fail" and f"loss at step {report['first_loss_fail_step']}" in verdict[1]
    assert page.row("first_loss_fail_step") == [str(report["first_loss_fail_step"])]
    assert page.row("steps") == [str(report["steps"])]


def test_compare_writes_one_page_for_several_reports_and_names_the_forecast(tmp_path):
    from pathlib import Path

    reports = [str(p) for p in sorted(Path(__file__).resolve().parent.parent.glob("reports/baseline/repro_850_*.json"))
               if "bfloat16_c.json" in p.name or p.name == "repro_850_c.json"]
    assert len(reports) == 2
    assert main(["compare", *reports, "--html", str(tmp_path / "c.html")]) == 0
    page = _read(tmp_path / "c.html")
    data = [read_report(p) for p in reports]
    assert page.row("status") == [d["status"] for d in data]
    forecast = page.row("forecast_param_fail_step (extrapolated)")
    for cell, d in zip(forecast, data):
        step = d.get("forecast_param_fail_step")
        assert cell == "-" if step is None else ("forecast" in cell and "measure" in cell)
    assert len(page.images) == 1


def test_check_page_is_its_table(tmp_path):
    out, page_path = tmp_path / "check.json", tmp_path / "check.html"
    assert main(["check", "residual", "--backend", "c", "--json-out", str(out), "--html", str(page_path)]) == 0
    report = json.loads(out.read_text())
    page = _read(page_path)
    verdicts = {r[0]: r[5] for r in page.tables[0][1:]}
    assert verdicts == {p["property"]: p["verdict"] for p in report["properties"]}
    assert page.paragraphs[0][0] == "pass"
