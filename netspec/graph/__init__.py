"""Compiling a net spec into a static graph: filtering, splits, sharing, shapes, FLOPs, backward needs."""
