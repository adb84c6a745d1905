"""One module per CLI command: each has ``add(subparsers)`` and ``main(args) -> exit code``."""
