"""Tests of the process-state API (nbaccel.state, nbaccel.state.split, nbaccel.state.data)."""
