"""The README and the docs/ pages: every block marked `<!-- output: COMMAND -->` in README.md or
docs/*.md is exactly what COMMAND prints today, the exact-error table equals `pipelines.demo`'s,
the README stays short with a table of contents, every relative link resolves, and every command
written in them names a module or script that exists, with options it takes and files that
exist."""
from __future__ import annotations

import collections
import importlib.util
import glob
import os
import re
import shlex

import pytest

from pipelines import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 350


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        return handle.read()


DOCUMENTS = {path: read(path) for path in reference.documents(ROOT)}
README = DOCUMENTS["README.md"]


def output_blocks(text: str):
    return [(m.group("command"), m.group("text")) for m in reference.OUTPUT_BLOCK.finditer(text)]


BLOCKS = [(path, command, text) for path, document in DOCUMENTS.items()
          for command, text in output_blocks(document)]


def page_with(marker: str) -> str:
    """The one README or docs page that holds `marker`."""
    pages = [path for path, text in DOCUMENTS.items() if marker in text]
    assert len(pages) == 1, f"{marker!r} must be in exactly one page, found in {pages}"
    return pages[0]


def printed(command: str) -> str:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return reference.printed(command)
    finally:
        os.chdir(cwd)


def test_the_docs_have_output_blocks():
    commands = [command for _, command, _ in BLOCKS]
    assert any("pipelines.caps" in c for c in commands)
    assert any("pipelines.plan" in c for c in commands)


@pytest.mark.parametrize("path,command,text", BLOCKS,
                         ids=[f"{path}:{command[:60]}" for path, command, _ in BLOCKS])
def test_output_block_is_what_its_command_prints(path, command, text):
    assert printed(command) == text, (
        f"{path}: the block of `{command}` is stale: python3 -m pipelines.reference "
        f"--update-readme {path}")


def test_a_stale_block_is_found_and_the_update_restores_it():
    path, command, text = BLOCKS[0]
    document = DOCUMENTS[path]
    stale = document.replace(text, text.replace("MaxSE", "MinSE", 1), 1)
    assert stale != document
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert reference.updated(stale) == document
    finally:
        os.chdir(cwd)


def test_the_update_leaves_a_page_without_markers_alone():
    text = "# A page\n\nNo generated tables here.\n"
    assert reference.updated(text) == text


def test_the_update_cli_rewrites_the_file_it_is_given(tmp_path, capsys):
    path, command, text = BLOCKS[0]
    page = tmp_path / "page.md"
    page.write_text(DOCUMENTS[path].replace(text, "stale\n", 1), encoding="utf-8")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert reference.main(["--update-readme", str(page)]) == 0
    finally:
        os.chdir(cwd)
    assert page.read_text(encoding="utf-8") == DOCUMENTS[path]
    assert capsys.readouterr().out == f"{page}: updated\n"


def _error_table():
    page = DOCUMENTS[page_with("Exact errors at T = 1000")]
    section = page.split("Exact errors at T = 1000", 1)[1].split("\n\n", 2)[1]
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
    table = _error_table()
    assert len(table) >= 5
    laplace = {row[0]: row for row in error_table(1000, {"epsilon": 1.0}, 2026)}
    gaussian = {row[0]: row for row in error_table(1000, {"rho": 0.5}, 2026)}
    for name, ((l_max, l_mean), (g_max, g_mean)) in table.items():
        assert round(laplace[name][3], 2) == l_max and round(laplace[name][4], 2) == l_mean, name
        assert round(gaussian[name][3], 2) == g_max and round(gaussian[name][4], 2) == g_mean, name


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_demo_truncation_figures_in_the_prose_come_from_the_caps_block():
    path, _, caps = [block for block in BLOCKS if "pipelines.caps" in block[1]][0]
    configured = [line for line in caps.splitlines()
                  if line.startswith("max_contributions=6, max_contributions_per_step=2 ")][0]
    cut = re.search(r"(\d+) \((\d+\.\d) %\)", configured)
    events = re.search(r"(\d+) events in the horizon", caps).group(1)
    page = _words(DOCUMENTS[path])
    assert f"{events} events in the horizon, {cut.group(1)} ({cut.group(2)} %) cut" in page
    assert f"On the demo data, {cut.group(2)} % of the events are cut" in page


# ---- the README is short, has a table of contents, and every link resolves ----

def without_code(text: str) -> str:
    """`text` without fenced code blocks (whose `#` lines are no headings) and inline code."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return re.sub(r"`[^`\n]*`", "", "\n".join(kept))


def headings(text: str) -> list:
    kept, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            kept.append(line)
    return kept


def anchors(text: str) -> set:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces to `-`,
    repeats numbered."""
    seen = collections.Counter()
    found = set()
    for line in headings(text):
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str) -> list:
    return [target for target in LINK.findall(without_code(text))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def test_the_readme_is_at_most_350_lines():
    assert len(README.splitlines()) <= README_MAX_LINES


def test_the_readme_has_the_two_set_up_commands_and_the_transform_table():
    assert ('python3 -m pip install -e . && python3 -m pipelines.run --config '
            'configs/active_users.yaml') in README
    assert 'python3 -m pip install -e ".[test]" && python3 -m pytest -q' in README
    assert page_with("<!-- transforms:start -->") == "README.md"


def test_the_readme_has_a_table_of_contents_of_its_sections_and_the_docs():
    contents = README.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    targets = links(contents)
    own = {target[1:] for target in targets if target.startswith("#")}
    sections = anchors("\n".join(line for line in headings(README)
                                 if line.startswith("## ") and line != "## Contents"))
    assert sections <= own, f"sections missing from the contents: {sections - own}"
    assert own <= anchors(README), f"contents links to missing headings: {own - anchors(README)}"
    pages = {target.split("#")[0] for target in targets if not target.startswith("#")}
    assert pages == {path for path in DOCUMENTS if path.startswith("docs/")}


@pytest.mark.parametrize("path", sorted(DOCUMENTS))
def test_every_relative_link_points_at_an_existing_file_and_heading(path):
    folder = os.path.dirname(path)
    for target in links(DOCUMENTS[path]):
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(folder, file)) if file else path
        assert os.path.exists(os.path.join(ROOT, resolved)), f"{path}: {target} does not exist"
        if anchor and resolved.endswith(".md"):
            assert anchor in anchors(read(resolved)), f"{path}: {target}: no such heading"


def test_the_link_check_can_fail():
    """Negative control: a missing file and a missing heading are both caught."""
    text = "# Title\n\n[a](docs/none.md) [b](#title) [c](#nothing) `[d](no.md)`\n"
    assert links(text) == ["docs/none.md", "#title", "#nothing"]
    assert anchors(text) == {"title"}


def test_no_page_writes_the_number_of_tests_by_hand():
    for path, text in DOCUMENTS.items():
        assert not re.search(r"\b\d[\d,]* (tests|passed)\b", text), path


# ---- every command written in the README and the docs names what exists ----

def commands(text: str) -> list:
    """Every `python3 ...` command in bash blocks, output markers and inline code."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += block.replace("\\\n", " ").splitlines()
    found += re.findall(r"`(python3 [^`\n]+)`", text)
    found += [command for command, _ in output_blocks(text)]
    return [part.strip() for line in found for part in line.split("&&")
            if part.strip().startswith("python3 ")]


def _beam_options() -> set:
    from apache_beam.options.pipeline_options import PipelineOptions
    return set(PipelineOptions([]).get_all_options())


COMMANDS = sorted({(path, command) for path, text in DOCUMENTS.items()
                   for command in commands(text)})


@pytest.mark.parametrize("path,command", COMMANDS, ids=[f"{p}:{c[:70]}" for p, c in COMMANDS])
def test_every_command_names_a_module_with_its_options_and_existing_files(path, command):
    words = shlex.split(command)
    if words[1] == "-m":
        module, args = words[2], words[3:]
        if module in ("pip", "pytest"):
            return
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"{path}: no module {module}"
        source = read(os.path.relpath(spec.origin, ROOT))
    else:
        script, args = words[1], words[2:]
        assert os.path.isfile(os.path.join(ROOT, script)), f"{path}: no script {script}"
        source = read(script)
    beam_options = _beam_options() if module_runs_beam(source) else set()
    for word in args:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert f'"{flag}"' in source or flag[2:] in beam_options, (
                f"{path}: `{command}`: {flag} is not an option of it")
        elif word.startswith("demo:") and "<" not in word:
            name = word[len("demo:"):]
            assert os.path.isfile(os.path.join(ROOT, "configs", f"{name}.yaml")), word
        elif word.endswith((".yaml", ".py")) and "<" not in word and "://" not in word:
            assert os.path.isfile(os.path.join(ROOT, word)), f"{path}: `{command}`: no {word}"


def module_runs_beam(source: str) -> bool:
    """Jobs that pass unknown options on to Beam (`pipelines.run`, `pipelines.schedule`)."""
    return "parse_known_args" in source


def test_docs_mechanisms_has_a_row_for_every_mechanism_in_both_tables():
    """docs/mechanisms.md's table of the mechanisms (paper, factorization, variance) and its
    table of integer or fractional values name every mechanism `make` builds."""
    from transforms.mechanisms import NAMES
    text = open(os.path.join(ROOT, "docs", "mechanisms.md")).read()
    for name in NAMES:
        rows = [line for line in text.splitlines() if line.startswith(f"| `{name}`")]
        assert len(rows) == 2, (name, rows)


def test_papers_are_cited_by_author_and_year_as_docs_references_lists_them():
    """No "seed 00N" citation is left; every author-year citation of a seed paper in the code
    and the docs is a row of docs/references.md."""
    import re
    listed = {line.split("|")[1].strip() for line in open(os.path.join(
        ROOT, "docs", "references.md")) if line.startswith("| ") and "---" not in line}
    cited = re.compile(r"Andersson & Pagh 2023[ab]|Andersson et al\. 20\d\d|"
                       r"Fichtenberger et al\. 20\d\d|[Ss]eeds? 00\d")
    found = set()
    for folder in ("transforms", "pipelines", "docs"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.*"), recursive=True):
            if path.endswith((".py", ".md")):
                found.update(cited.findall(open(path, encoding="utf-8").read()))
    assert found and found <= listed, found - listed
