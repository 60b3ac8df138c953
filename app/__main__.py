"""`python -m app`: the command line (cli.py)."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
