"""``python -m nbaccel.agent HOST:PORT``: the same as the ``nbaccel-agent`` console script."""

from nbaccel.agent.cli import main

raise SystemExit(main())
