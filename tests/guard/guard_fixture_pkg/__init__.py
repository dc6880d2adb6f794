"""A small package whose model reads state from its other modules (for cross-module tests)."""
