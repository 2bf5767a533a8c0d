"""Runs of many runs: ``attribute`` (which kernel makes a run fail) and
``repro`` (the presets under every loss backend, and compare)."""
