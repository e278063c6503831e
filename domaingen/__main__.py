"""`python -m domaingen` is the same program as the `domaingen` command."""

from domaingen.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
