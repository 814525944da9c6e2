"""CLI sub-commands; each module has ``add_parser(subparsers)`` and ``run(args, comm)``."""
