"""Rewrite tests/module_seconds.json, the order the suite hands its modules out in (tests/conftest.py), from a whole
run's JUnit XML: ``python -m pytest --junitxml=run.xml`` then ``python -m tests.module_seconds run.xml``. Each
module's seconds are the sum of its tests' (setup, call and teardown): the time it holds its worker."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).parent / "module_seconds.json"


def module_seconds(junit_xml: Path) -> dict[str, float]:
    """Seconds per test module (``test_cache``, ...), longest first."""
    total: Counter[str] = Counter()
    for case in ET.parse(junit_xml).iter("testcase"):
        total[case.get("classname", "").split(".")[1]] += float(case.get("time", "0"))
    return {module: round(seconds, 1) for module, seconds in total.most_common()}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        sys.stderr.write("usage: python -m tests.module_seconds RUN.xml (pytest --junitxml of a whole run)\n")
        return 2
    TABLE.write_text(json.dumps(module_seconds(Path(argv[0])), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
