"""JUnit XML, as CI systems read it (Jenkins, GitLab, GitHub's test reporters):
one <testsuite> of <testcase>s, a failing one holding a <failure> whose
message says why, the report's own figures in <system-out>. check writes a
case per property, gate a case per gate; the commands write the text as every
report is written (report.write_text: atomically, never half a file). Built
with the standard library's ElementTree, so every character is escaped as XML
needs. Imports nothing of ckparity: check's suite makes its cases."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass


@dataclass(frozen=True)
class TestCase:
    classname: str
    name: str
    seconds: float = 0.0
    failure: str | None = None  # None: passed
    output: str = ""            # the case's figures, for a person reading the CI page


def xml(suite: str, cases: list[TestCase]) -> str:
    root = ET.Element("testsuite", name=suite, tests=str(len(cases)),
                      failures=str(sum(c.failure is not None for c in cases)), errors="0",
                      time=f"{sum(c.seconds for c in cases):.3f}")
    for c in cases:
        case = ET.SubElement(root, "testcase", classname=c.classname, name=c.name, time=f"{c.seconds:.3f}")
        if c.failure is not None:
            ET.SubElement(case, "failure", message=c.failure.splitlines()[0][:500] if c.failure else "failed",
                          type="ckparity").text = c.failure
        if c.output:
            ET.SubElement(case, "system-out").text = c.output
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
