"""`python3 -m sparkconsole.agent`: the agent run in place, as a node runs it (the arguments: agent/__init__.py)."""

import sys

from .main import main

sys.exit(main())
