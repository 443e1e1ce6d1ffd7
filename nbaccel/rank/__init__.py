"""Child side: what a rank process runs after it is started (bootstrap, stdio capture, display, progress and import hooks)."""
