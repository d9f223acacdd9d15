"""The public name of data handlers' registry: a plugin calls `gpu_prep.mix.register_handler(name, fn)`.
Mixing datasets itself lives in read/mix.py."""

from gpu_prep.read.mix import register_handler

__all__ = ["register_handler"]
