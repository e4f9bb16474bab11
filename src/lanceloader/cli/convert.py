"""``lanceloader convert SRC OUT``: :func:`lanceloader.convert` from the command line, with a
progress bar and the summary printed at the end. Bad input, an output that cannot be written
(an existing dataset without ``--mode``, a non-Lance directory, a missing bucket) and another
convert writing the same output are one line on stderr and exit code 2."""

from __future__ import annotations

import argparse

from lanceloader.cli.errors import CommandError, input_errors
from lanceloader.write.convert import convert as convert_source


def convert(args: argparse.Namespace) -> int:
    with input_errors():
        try:
            summary = convert_source(
                args.source,
                args.out,
                mode=args.mode,
                on_error=args.on_error,
                resize=args.resize,
                check_images=args.check_images,
                labels=args.labels,
                progress=not args.quiet,
            )
        except FileExistsError as exc:
            raise CommandError(
                str(exc)
                .replace("mode='overwrite'", "--mode overwrite")
                .replace("mode='append'", "--mode append")
            ) from exc
        except (OSError, RuntimeError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise CommandError(str(exc)) from exc
    print(summary)
    return 0
