"""mask: token places + trained spans -> loss_mask; truncation; rows left with nothing to train.

project.py  every step, written once against the array module xp (numpy or cupy): places, projection,
            truncation and the rows it drops (Masked)
"""

__all__ = ["project"]
