"""ckptguard: runtime guard for torch.utils.checkpoint (see its issue; stub until then)."""
