"""Prints the transform table and config reference, generated from the registry; with
--update-readme, rewrites every generated part of the given Markdown files in place (README.md
and the pages of docs/ by default): the two registry tables (between `<!-- transforms:start -->`
/ `<!-- registry:start -->` and their `:end` markers, wherever a file has them) and each block
marked `<!-- output: python3 -m MODULE ARGS -->` with what that command prints now.

    python3 -m pipelines.reference [--update-readme [README.md docs/operations.md ...]]
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import importlib
import io
import os
import re
import shlex
import sys

from transforms import registry

OUTPUT_BLOCK = re.compile(r"(<!-- output: (?P<command>[^>]+?) -->\n```text\n)(?P<text>.*?)(```)",
                          re.S)
TABLES = {"transforms": registry.transform_table, "registry": registry.config_reference}


def documents(root: str = ".") -> list:
    """The Markdown files whose generated parts are kept equal to their commands: README.md and
    docs/*.md under `root`, as paths relative to it."""
    pages = sorted(os.path.relpath(path, root)
                   for path in glob.glob(os.path.join(root, "docs", "*.md")))
    return ["README.md"] + [page.replace(os.sep, "/") for page in pages]


def printed(command: str) -> str:
    """What `python3 -m MODULE ARGS` prints (run in this process)."""
    words = shlex.split(command)
    if words[:2] != ["python3", "-m"] or len(words) < 3:
        raise ValueError(f"`command` must be python3 -m MODULE ARGS; got {command!r}.")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = importlib.import_module(words[2]).main(words[3:])
    if code != 0:
        raise ValueError(f"`command` must exit 0; got {code} from {command!r}.")
    return buffer.getvalue()


def updated(text: str) -> str:
    text = OUTPUT_BLOCK.sub(lambda m: m.group(1) + printed(m.group("command")) + m.group(4),
                            text)
    for name, make in TABLES.items():
        start, end = f"<!-- {name}:start -->\n", f"\n<!-- {name}:end -->"
        head, found, rest = text.partition(start)
        if not found:
            continue
        _, closed, tail = rest.partition(end)
        if not closed:
            raise ValueError(f"`<!-- {name}:start -->` must be followed by `<!-- {name}:end -->`.")
        text = head + start + make() + end + tail
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update-readme", metavar="FILE", nargs="*",
                        help="rewrite the generated parts of these Markdown files in place "
                             "(none given: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    if args.update_readme is not None:
        for path in args.update_readme or documents():
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            new = updated(text)
            if new != text:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(new)
            print(f"{path}: {'updated' if new != text else 'already up to date'}")
        return 0
    print(registry.transform_table() + "\n\n" + registry.config_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
