"""Prints the README's transform table and config reference, generated from the registry.

    python3 -m pipelines.reference
"""
from __future__ import annotations

import argparse
import sys

from transforms import registry


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python3 -m pipelines.reference", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print(registry.transform_table() + "\n\n" + registry.config_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
