"""``python -m simbackend --port 9100 [--slots 8] ...`` (no Django needed)."""

from __future__ import annotations

import argparse

from .config import add_arguments
from .server import run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simbackend", description=__doc__)
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    try:
        run(options)
    except ValueError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
