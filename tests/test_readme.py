"""The README's figures come from commands: every block marked `<!-- output: COMMAND -->` is
exactly what COMMAND prints today, and the exact-error table equals `pipelines.demo`'s."""
from __future__ import annotations

import os
import re

import pytest

from pipelines import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def output_blocks(text: str):
    return [(m.group("command"), m.group("text")) for m in reference.OUTPUT_BLOCK.finditer(text)]


def printed(command: str) -> str:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return reference.printed(command)
    finally:
        os.chdir(cwd)


def test_the_readme_has_output_blocks():
    commands = [command for command, _ in output_blocks(README)]
    assert any("pipelines.caps" in c for c in commands)
    assert any("pipelines.plan" in c for c in commands)


@pytest.mark.parametrize("command,text", output_blocks(README))
def test_output_block_is_what_its_command_prints(command, text):
    assert printed(command) == text, (
        f"README block of `{command}` is stale: python3 -m pipelines.reference "
        f"--update-readme README.md")


def test_a_stale_block_is_found_and_the_update_restores_it():
    command, text = output_blocks(README)[0]
    stale = README.replace(text, text.replace("MaxSE", "MinSE", 1), 1)
    assert stale != README
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert reference.updated(stale) == README
    finally:
        os.chdir(cwd)


def _readme_error_table():
    section = README.split("Exact errors at T = 1000", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = cells[0].split(" ")[0]
        laplace = [float(v) for v in cells[1].split(" / ")]
        gaussian = [float(v) for v in cells[2].split(" / ")]
        rows[name] = (laplace, gaussian)
    return rows


def test_exact_error_table_equals_pipelines_demo():
    from pipelines.demo import error_table
    table = _readme_error_table()
    assert len(table) >= 5
    laplace = {row[0]: row for row in error_table(1000, {"epsilon": 1.0}, 2026)}
    gaussian = {row[0]: row for row in error_table(1000, {"rho": 0.5}, 2026)}
    for name, ((l_max, l_mean), (g_max, g_mean)) in table.items():
        assert round(laplace[name][3], 2) == l_max and round(laplace[name][4], 2) == l_mean, name
        assert round(gaussian[name][3], 2) == g_max and round(gaussian[name][4], 2) == g_mean, name


def test_demo_truncation_figures_in_the_prose_come_from_the_caps_block():
    caps = [text for command, text in output_blocks(README) if "pipelines.caps" in command][0]
    configured = [line for line in caps.splitlines()
                  if line.startswith("max_contributions=6, max_contributions_per_step=2 ")][0]
    cut = re.search(r"(\d+) \((\d+\.\d) %\)", configured)
    events = re.search(r"(\d+) events in the horizon", caps).group(1)
    assert f"{events} events in the\nhorizon, {cut.group(1)} ({cut.group(2)} %) cut" in README
    assert f"On the demo data, {cut.group(2)} % of the events are cut" in README
