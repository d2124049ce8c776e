"""Sync detection: the event model, the rules, and the modes that produce events."""
