"""Autograd-aware ops, one module per C kernel family."""
