"""resolution layer."""
