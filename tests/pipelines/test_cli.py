"""Every command-line tool: help text on every option, descriptions printed as written, and
`--help` that does nothing else."""
from __future__ import annotations

import os
import re

import pytest

from pipelines import caps, demo, plan, reference, report, run, schedule
from pipelines.demo_data import generate

CLIS = {"caps": caps.main, "run": run.main, "schedule": schedule.main, "plan": plan.main, "report": report.main,
        "demo": demo.main, "reference": reference.main, "generate": generate.main}


def help_text(main, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def undocumented_options(text: str) -> list:
    options = text.split("options:", 1)[1].splitlines()
    undocumented = []
    for index, line in enumerate(options):
        match = re.match(r"^  (-\S+(?: \S+)?(?:, -\S+(?: \S+)?)*)(\s{2,}\S.*)?$", line)
        if not match or match.group(1).startswith(("-h", "--help")):
            continue
        follows = index + 1 < len(options) and options[index + 1].startswith(" " * 8)
        if match.group(2) is None and not follows:
            undocumented.append(match.group(1))
    return undocumented


@pytest.mark.parametrize("name", sorted(CLIS))
def test_every_option_has_help_text(name, capsys):
    assert undocumented_options(help_text(CLIS[name], capsys)) == []


def test_the_check_finds_an_undocumented_option():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--documented", help="yes")
    parser.add_argument("--a-rather-long-undocumented-option", metavar="VALUE")
    parser.add_argument("--bare", action="store_true")
    assert undocumented_options(parser.format_help()) == [
        "--a-rather-long-undocumented-option VALUE", "--bare"]


@pytest.mark.parametrize("name", ["run", "schedule", "plan", "report", "generate", "caps"])
def test_descriptions_keep_their_line_breaks(name, capsys):
    """The usage block of each module docstring is printed as written (not reflowed)."""
    text = help_text(CLIS[name], capsys)
    assert f"    python3 -m pipelines." in text


def test_generate_help_writes_nothing_and_the_bundled_files_are_its_output(tmp_path, capsys):
    before = {n: os.path.getmtime(os.path.join(generate.HERE, n))
              for n in os.listdir(generate.HERE) if n.endswith(".jsonl")}
    help_text(generate.main, capsys)
    assert before == {n: os.path.getmtime(os.path.join(generate.HERE, n)) for n in before}
    assert generate.main(["--check"]) == 0
    assert generate.main(["--out", str(tmp_path), "--seed", "7"]) == 0
    assert generate.main(["--out", str(tmp_path), "--seed", "7", "--check"]) == 0
    assert generate.main(["--out", str(tmp_path), "--check"]) == 1  # another seed differs
