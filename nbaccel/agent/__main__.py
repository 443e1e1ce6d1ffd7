"""``python -m nbaccel.agent HOST:PORT``: the same as the ``nbaccel-agent`` console script."""

from .cli import main

raise SystemExit(main())
