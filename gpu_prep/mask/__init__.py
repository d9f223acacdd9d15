"""mask: token places + trained spans -> loss_mask; truncation; rows left with nothing to train.

project.py  every step, written once against the array module xp (numpy or cupy): places, projection,
            truncation and the rows it drops (Masked)
pairs.py    preference pairs and KTO rows cut into prompt and completions, as TRL cuts them
"""

__all__ = ["pairs", "project"]
