"""regions layer."""
