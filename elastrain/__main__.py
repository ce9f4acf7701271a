"""`python -m elastrain` is the `elastrain` command."""

import sys

from elastrain.cli.main import main

sys.exit(main())
