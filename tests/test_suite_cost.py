"""What the suite costs, recorded: tools/test_durations.py sums a JUnit report per test file into the table of
docs/development.md (between its markers; the numbers are one run's, so only the markers and the table's form are
checked here), and .ci/run prints the wall time of each install step and pytest's slowest tests."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("test_durations", ROOT / "tools" / "test_durations.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("test_durations", tool)  # its dataclass looks its module up
    spec.loader.exec_module(sys.modules["test_durations"])
    return sys.modules["test_durations"]


REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_a" name="test_one" time="1.250"/>
<testcase classname="tests.test_a" name="test_two[x]" time="10.500"><failure message="no"/></testcase>
<testcase classname="tests.test_b.TestGroup" name="test_three" time="0.250"><skipped message="why"/></testcase>
<testcase classname="tests.test_c" name="test_four" time="3.000"/>
<testcase classname="tests.sub.test_d" name="test_five" time="2.000"/>
</testsuite></testsuites>
"""


def test_the_report_is_summed_per_file_and_the_slowest_files_come_first(tmp_path):
    tool = _tool()
    (tmp_path / "a.xml").write_text(REPORT)
    (tmp_path / "b.xml").write_text(REPORT.replace('time="3.000"', 'time="4.000"'))  # a second run, summed
    files = tool.read_reports([tmp_path / "a.xml", tmp_path / "b.xml"])
    assert set(files) == {"tests/test_a.py", "tests/test_b.py", "tests/test_c.py", "tests/sub/test_d.py"}
    a = files["tests/test_a.py"]
    assert (a.tests, a.seconds, a.failed, a.slowest) == (4, 23.5, 2, (10.5, "test_two[x]"))
    assert (files["tests/test_b.py"].skipped, files["tests/test_c.py"].seconds) == (2, 7.0)
    block = tool.table(files, when="2026-12-07", command="pytest -q", load="1.0-2.0", commit="abc1234", rows=2)
    lines = block.splitlines()
    assert lines[0].startswith("Measured 2026-12-07 on abc1234: `pytest -q`,") and "load average 1.0-2.0" in lines[0]
    assert "10 tests in 4 files, 35 s of test time, 2 failed." in lines[0]  # 23.5 + 0.5 + 7 + 4
    assert lines[4] == "| tests/test_a.py | 4 | 24 | 67.1 % | test_two[x] (10) |"  # 23.5 / 35
    assert lines[5].startswith("| tests/test_c.py | 2 | 7 | 20.0 % |")
    assert lines[6] == "| 2 other files | 4 | 4 | 12.9 % | |"  # test_d 4 s, test_b 0.5 s


def test_the_block_is_replaced_between_the_markers_and_a_missing_marker_is_named(tmp_path):
    tool = _tool()
    text = f"intro\n{tool.START}\nold table\n{tool.END}\nafter\n"
    assert tool.replace_block(text, "new") == f"intro\n{tool.START}\nnew\n{tool.END}\nafter\n"
    with pytest.raises(ValueError, match="TEST-DURATIONS:BEGIN .* add the two markers"):
        tool.replace_block("intro\n", "new")


def test_the_docs_keep_the_table_between_its_markers():
    """docs/development.md holds a table the tool wrote (its numbers are a run's: not checked), dated."""
    tool = _tool()
    text = (ROOT / "docs" / "development.md").read_text()
    block = text.split(tool.START, 1)[1].split(tool.END, 1)[0]
    assert re.match(r"\nMeasured \d{4}-\d{2}-\d{2} on \w+: `.+`, \d+ CPUs .*load average .* during the run; "
                    r"\d+ tests in \d+ files, \d+ s of test time", block), block[:300]
    assert "| file | tests | seconds | share | slowest test (s) |" in block
    assert "python tools/test_durations.py" in text  # the command that regenerates it


def test_ci_prints_each_steps_time_and_the_slowest_tests():
    """.ci/run is `make -j3 test` with pytest's 30 slowest tests; every step of it prints its wall time."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make -j3 test" in ci and "--durations=30" in ci
    makefile = (ROOT / "Makefile").read_text()
    for step in ("llamacpp", "vllm", "sglang", "mlx", "compat-check", "test-core", "test-engines", "test4"):
        assert re.search(rf"^{step}:.*\n\t@\$\(TIMED\) {step} ", makefile, re.M), step
    for step, venv in (("install", "VENV"), ("install4", "VENV4")):
        assert re.search(rf"^\$\({venv}\)/.installed:.*\n\t@\$\(TIMED\) {step} \$\(PYTHON\) tools/venv_cache.py",
                         makefile, re.M), step


def test_the_timer_prints_the_time_and_keeps_the_exit_status():
    import subprocess

    done = subprocess.run(["bash", ROOT / "tools" / "timed.sh", "step", "sh", "-c", "echo hi; exit 3"],
                          capture_output=True, text=True)
    assert done.returncode == 3
    assert re.fullmatch(r"hi\n\[time\] step: \d+ s wall, exit 3 \(load average [\d.]+ [\d.]+ [\d.]+\)\n", done.stdout)
