"""The node side of several machines: ``nbaccel-agent``, which joins a kernel's ``Cluster`` and
starts, watches and reports that node's ranks. It runs on the nodes, never in the kernel; the
kernel side is ``nbaccel.cluster`` and the signed link between them ``nbaccel.net``. See
docs/multinode.md."""
