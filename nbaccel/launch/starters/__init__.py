"""The rank starters (``RankStarter``): how one local rank process is made.

``fork.py`` forks the calling process, ``fork_server.py`` asks nbaccel's fork server to fork it,
``spawn.py`` starts a fresh interpreter. ``nbaccel.launch.plan.choose_starter`` picks one.
"""
