"""effects layer."""
