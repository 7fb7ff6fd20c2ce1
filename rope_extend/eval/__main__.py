"""``python -m rope_extend.eval MODEL --spec SPEC ... --suite quick --out DIR``: the same command as
``rope-extend eval`` (one parser, in :mod:`rope_extend.cli.eval_cmd`)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from rope_extend.cli import main as cli_main

    return cli_main(["eval", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
