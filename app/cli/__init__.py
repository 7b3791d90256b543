"""The ``rttsched`` command line: one subcommand per process.

Each subcommand is a module here with ``HELP``, ``add_arguments(parser)`` and ``run(args, settings) -> int``.
Command modules keep their top-level imports light (heavy imports go inside ``run``) so ``--help`` is fast.
"""
