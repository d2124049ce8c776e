"""Sync detection: the event model, the rules, the residency strategies and the detectors that
produce events."""
