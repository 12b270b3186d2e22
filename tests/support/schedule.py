"""The order the test files run in: the longest first, from ``durations.json``, refreshed on purpose.

``durations.json`` holds the seconds each test file took (each worker's wall per test, summed by file) in the last
whole run that measured them: ``pytest -n 2 --dist loadfile --write-durations`` (every test under the testpaths: no
file named, no -k, -m or --lf) writes it when it passes; no other run writes it. Every run sorts the files longest
first, so that with ``pytest -n 2 --dist loadfile`` the long ones start at once and the short ones fill the end. A
file not listed yet goes last. Commit ``durations.json`` when you refreshed it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vocagno.doors.writing import write_atomically

__all__ = ["OPTION", "Schedule"]

OPTION = "--write-durations"


class Schedule:
    """The hooks of a conftest.py whose folder holds ``durations.json`` (paths relative to that folder)."""

    def __init__(self, durations: Path):
        self.durations = durations
        self.spent: dict[str, float] = {}

    def seconds(self) -> dict[str, int]:
        """The figures of the last whole run; none where the file is missing, not a regular file or not a mapping of
        test files to seconds (it only orders the run: a bad one is ignored, and the next refresh replaces it)."""
        from vocagno.doors.untrusted import read_json

        try:
            seconds = read_json(self.durations.name, folder=self.durations.parent)
        except (OSError, ValueError):
            return {}
        figures = seconds.items() if isinstance(seconds, dict) else [(None, None)]
        if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in figures):
            return {}
        return seconds

    def file_of(self, config, nodeid: str) -> str:
        """A test's file relative to the durations' folder (``unit/test_loss.py``), from its node id."""
        path = Path(config.rootpath, nodeid.split("::")[0]).resolve()
        return path.relative_to(self.durations.parent.resolve()).as_posix()

    def order(self, config, items) -> None:
        seconds = self.seconds()
        items.sort(key=lambda item: -seconds.get(self.file_of(config, item.nodeid), 0))  # stable within a file

    def record(self, report) -> None:
        nodeid = report.nodeid.split("::")[0]
        self.spent[nodeid] = self.spent.get(nodeid, 0.0) + report.duration

    def hooks(self) -> dict:
        """The pytest hooks a conftest.py takes from it: ``globals().update(Schedule(path).hooks())``."""
        return {"pytest_addoption": self.addoption, "pytest_collection_modifyitems": self.order,
                "pytest_runtest_logreport": self.record, "pytest_sessionfinish": self.write}

    def addoption(self, parser) -> None:
        parser.addoption(OPTION, action="store_true",
                         help=f"write each test file's seconds to {self.durations.name} (a whole run that passes)")

    def write(self, session, exitstatus) -> None:
        config = session.config
        if not config.getoption(OPTION) or hasattr(config, "workerinput"):
            return  # not asked for, or a worker (xdist's controller sees every report)
        whole = (config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
                 and not config.option.markexpr and not getattr(config.option, "lf", False))
        if not whole or exitstatus != 0 or not self.spent:
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"{OPTION}: {self.durations.name} not written: it takes a whole run (every test "
                                    "under the testpaths) that passes")
            return
        seconds = {self.file_of(config, nodeid): round(spent) for nodeid, spent in self.spent.items()}
        ordered = dict(sorted(seconds.items(), key=lambda item: -item[1]))
        write_atomically(self.durations, json.dumps(ordered, indent=1) + "\n")  # never through a link
