"""Sequence mixers, registered by name (see docs/INTERFACES.md for the interface).

Importing this package registers every mixer in MIXERS.
"""
from models.mixers.registry import MIXERS, get_mixer, register
from models.mixers import attention, linear, based, delta, lightning  # noqa: F401  (register)

__all__ = ["MIXERS", "get_mixer", "register"]
