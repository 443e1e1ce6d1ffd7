"""The kernel side of several machines: the ``Cluster`` that node agents join, how agents are
started on the nodes (``starters``: Slurm, ssh, a template), and launches and persistent workers
whose ranks live on those agents. The node side is ``nbaccel.agent``; the signed link between them
is ``nbaccel.net``. See docs/multinode.md."""
