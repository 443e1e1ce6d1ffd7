"""A stand-in kernel for tests that kill it: makes a Cluster, reports it, launches a long sleep.

Prints one JSON line ``{"address", "token_file"}``, then ``launched`` once the launch is sent.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from nbaccel import Cluster, notebook_launcher
from nbaccel.testing import CollectingSink


def _sleep() -> None:
    import time

    time.sleep(120)


def main() -> None:
    cluster = Cluster("127.0.0.1:0")
    print(json.dumps({"address": cluster.address, "token_file": cluster.token_file}), flush=True)
    cluster.wait(nodes=int(sys.argv[1]), timeout=60)
    threading.Timer(0.5, lambda: print("launched", flush=True)).start()
    notebook_launcher(_sleep, cluster=cluster, output=CollectingSink())
    time.sleep(120)


if __name__ == "__main__":
    main()
