"""Several machines: the node agent (``nbaccel-agent``), the kernel's ``Cluster``, and the signed
transport between them. See docs/multinode.md."""
