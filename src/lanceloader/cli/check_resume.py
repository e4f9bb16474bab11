"""``lanceloader check-resume``: :func:`lanceloader.check_resume` on a loader factory named as
``module:function``, its report printed; exit status 0 when every resumed run delivered the
uninterrupted run's rows, 1 at the first divergence, 2 for bad arguments.

Example::

    $ lanceloader check-resume myjob:make_loader --runs 200 --world-sizes 1,2,4 --ids id
"""

from __future__ import annotations

import argparse
from typing import Any

from lanceloader.cli.bench import import_transform
from lanceloader.cli.errors import CommandError
from lanceloader.cli.ledger import whole_number
from lanceloader.resume_check import check_resume as run_check

EPILOG = """\
examples:
  lanceloader check-resume myjob:make_loader
  lanceloader check-resume myjob:make_loader --runs 1000 --world-sizes 1,2,4 --ids id
  lanceloader check-resume myjob:make_loader --epochs 3 --resumes 4 --seed 7 --contents --ids id
  lanceloader check-resume myjob:make_mix_loader --on-step myjob:feedback --allow-changes batch_size

FACTORY is module:function; function(rank, world_size) builds the loader of that rank as the
training job builds it (./myjob.py is found from the current directory). Every row a resumed run
delivers is compared with the uninterrupted run's row at the same sample: by --ids, or by a hash
of the row's contents. Exit status 1 at the first divergence (the report says where).
"""


def world_sizes(text: str) -> tuple[int, ...]:
    """argparse type: ``1,2,4``, whole numbers >= 1.

    >>> world_sizes("1, 2,4")
    (1, 2, 4)
    """
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(
            f"must be world sizes N,M,... (whole numbers >= 1), e.g. 1,2,4; got {text!r}"
        )
    return tuple(int(p) for p in parts)


def add_check_resume(sub: Any) -> None:
    """The ``check-resume`` subcommand's parser."""
    p = sub.add_parser(
        "check-resume",
        help="check that a loader resumes exactly: interrupted runs against an uninterrupted one",
        description="Run a loader factory's loader uninterrupted, then many runs saved, rebuilt\n"
        "and resumed at random steps (on other world sizes too), and compare every row.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("factory", metavar="FACTORY", help="module:function(rank, world_size)")
    p.add_argument("--runs", type=whole_number, default=100, help="interrupted runs; default 100")
    p.add_argument(
        "--world-sizes",
        type=world_sizes,
        default=(1, 2),
        metavar="N,M,...",
        help="the reference runs on the first; default 1,2",
    )
    p.add_argument("--resumes", type=whole_number, default=3, help="resumes per run; default 3")
    p.add_argument("--epochs", type=whole_number, default=2, help="epochs; default 2")
    p.add_argument("--ids", metavar="COLUMN", help="a column naming each row; default a hash")
    p.add_argument("--contents", action="store_true", help="with --ids: compare a hash too")
    p.add_argument(
        "--allow-changes",
        metavar="A,B",
        help="settings load_state_dict may find changed, e.g. batch_size",
    )
    p.add_argument(
        "--on-step",
        metavar="MODULE:FUNCTION",
        help="called with each rank's loader before each batch (e.g. set_weights at a step)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="S", help="draws the runs; default 0")
    p.set_defaults(run=check_resume)


def check_resume(args: argparse.Namespace) -> int:
    """Print the report; 0 when it is OK, 1 at a divergence."""
    factory: Any = import_transform(args.factory, "FACTORY", "myjob:make_loader")
    on_step = (
        import_transform(args.on_step, "--on-step", "myjob:feedback") if args.on_step else None
    )
    allow = tuple(a.strip() for a in args.allow_changes.split(",")) if args.allow_changes else ()
    try:
        report = run_check(
            factory,
            runs=args.runs,
            world_sizes=args.world_sizes,
            resumes=args.resumes,
            epochs=args.epochs,
            ids=args.ids,
            contents=args.contents,
            allow_changes=allow,
            on_step=on_step,
            seed=args.seed,
        )
    except (ValueError, TypeError) as exc:  # bad arguments, or the factory's loader
        raise CommandError(str(exc)) from exc
    print(report)
    return 0 if report.ok else 1
