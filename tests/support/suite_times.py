"""What the suite's time went to, from pytest's JUnit XML (`.ci/run` writes one per pass):
`python -m tests.support.suite_times build/junit-*.xml` prints the tests and seconds per
directory and per database, and the file names of the 15 costliest test modules. The seconds are
summed over workers (so they exceed the wall clock by about the number of workers)."""

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main(paths: list[str]) -> None:
    by_dir: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_db: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_module: dict[str, float] = defaultdict(float)
    for path in paths:
        # The suite's own JUnit XML, written by pytest in this run: no untrusted input.
        for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314
            seconds = float(case.get("time") or 0)
            module = (case.get("classname") or "").replace(".", "/") + ".py"
            folder = module.split("/")[1] if module.count("/") > 1 else module
            db = m.group(1) if (m := re.search(r"\[(sqlite|postgresql)\b", case.get("name") or "")) else "-"
            for table, key in ((by_dir, folder), (by_db, db)):
                table[key][0] += 1
                table[key][1] += seconds
            by_module[module] += seconds
    for title, table in (("directory", by_dir), ("database", by_db)):
        print(f"{'by ' + title:<24}{'tests':>8}{'seconds':>10}")
        for key, (count, seconds) in sorted(table.items(), key=lambda kv: -kv[1][1]):
            print(f"  {key:<22}{int(count):>8}{seconds:>10.0f}")
    print("costliest modules (seconds)")
    for module, seconds in sorted(by_module.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {seconds:>7.0f}  {module}")


if __name__ == "__main__":
    main(sys.argv[1:])
