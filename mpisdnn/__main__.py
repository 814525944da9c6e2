"""``python -m mpisdnn`` is the same as the ``mpisdnn`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
