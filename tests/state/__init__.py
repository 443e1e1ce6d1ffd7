"""Tests of the process-state API (nbaccel.state, nbaccel.split, nbaccel.data)."""
