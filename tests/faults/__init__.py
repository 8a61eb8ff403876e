"""Fault replays: `replay.py` runs the trust cases the tests assert and shows what a user sees (not a test file)."""
