"""`python -m domaingen` is the same program as the `domaingen` command."""

from domaingen.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
