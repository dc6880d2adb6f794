"""Settings module read as ``cfg.SCALE`` by the model (a module attribute, not a global)."""

SCALE = 1.0
