"""``lanceloader convert SRC OUT``: :func:`lanceloader.convert` from the command line, with a
progress bar and the summary printed at the end."""

from __future__ import annotations

import argparse

from lanceloader.cli.errors import CommandError, input_errors
from lanceloader.write.convert import convert as convert_source


def convert(args: argparse.Namespace) -> int:
    with input_errors():
        try:
            summary = convert_source(args.source, args.out, mode=args.mode,
                                     on_error=args.on_error, resize=args.resize,
                                     progress=not args.quiet)
        except FileExistsError as exc:
            raise CommandError(str(exc).replace("mode='overwrite'", "--mode overwrite")
                               .replace("mode='append'", "--mode append")) from exc
    print(summary)
    return 0
