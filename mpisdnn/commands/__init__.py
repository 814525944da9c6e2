"""CLI sub-commands; each module has ``DESCRIPTION``, ``add_arguments(parser)`` and
``run(args, comm)``, and is listed in :data:`mpisdnn.cli.COMMANDS`."""
