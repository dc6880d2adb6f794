"""ckptlint: a static linter for torch.utils.checkpoint."""

__version__ = "0.2.0"
