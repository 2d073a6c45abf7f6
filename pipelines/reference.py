"""Prints the README's transform table and config reference, generated from the registry;
with --update-readme, rewrites every generated part of a README in place: the two registry
tables and each block marked `<!-- output: python3 -m MODULE ARGS -->` with what that command
prints now.

    python3 -m pipelines.reference [--update-readme README.md]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import sys

from transforms import registry

OUTPUT_BLOCK = re.compile(r"(<!-- output: (?P<command>[^>]+?) -->\n```text\n)(?P<text>.*?)(```)",
                          re.S)
TABLES = {"transforms": registry.transform_table, "registry": registry.config_reference}


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
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        text = head + start + make() + end + tail
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update-readme", metavar="README",
                        help="rewrite the generated parts of this file in place")
    args = parser.parse_args(argv)
    if args.update_readme:
        with open(args.update_readme, encoding="utf-8") as handle:
            text = handle.read()
        new = updated(text)
        with open(args.update_readme, "w", encoding="utf-8") as handle:
            handle.write(new)
        print(f"{args.update_readme}: {'updated' if new != text else 'already up to date'}")
        return 0
    print(registry.transform_table() + "\n\n" + registry.config_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
