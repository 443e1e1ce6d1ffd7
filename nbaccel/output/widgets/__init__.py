"""The widget view of a launch: the live view, one panel per rank, and the static copy left in the notebook."""
