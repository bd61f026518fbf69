"""`python -m pope.cli ...` runs the `pope` command."""

import sys

from pope.cli import main

sys.exit(main())
