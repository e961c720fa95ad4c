"""`python -m regional_node node ...`: run a regional node (see regional_node/cli.py)."""

from regional_node.cli import main

raise SystemExit(main())
