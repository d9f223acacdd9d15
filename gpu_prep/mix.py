"""The public name of data handlers' registry: a plugin calls `gpu_prep.mix.register_handler(name, fn)`.
The built-in handlers live in run/handlers.py, mixing datasets itself in read/mix.py."""

from gpu_prep.run.handlers import register_handler

__all__ = ["register_handler"]
