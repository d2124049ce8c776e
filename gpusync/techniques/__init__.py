"""Sync-avoidance techniques, each a naive and an optimized form with the same inputs and
outputs."""
