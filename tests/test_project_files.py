"""LICENSE and CITATION.cff say what pyproject.toml says."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_license_and_citation_agree_with_pyproject():
    pyproject = (REPO / "pyproject.toml").read_text()  # (tomllib needs Python 3.11)
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    license_text = (REPO / "LICENSE").read_text()
    assert 'license = { text = "MIT" }' in pyproject and license_text.startswith("MIT License")
    assert "The pathtwt authors" in license_text
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT"
    assert str(cff["version"]) == version
    paper = cff["preferred-citation"]
    assert paper["title"] == "A Smaller Transformer in Your Transformer"
    assert paper["identifiers"][0]["value"] == "arXiv:2609.20100"
    assert all("family-names" in a and "given-names" in a for a in paper["authors"])
