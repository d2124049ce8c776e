"""JSON Schemas of what gpusync writes and reads back (loaded with importlib.resources)."""
