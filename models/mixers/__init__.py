"""Sequence mixers, registered by name (see docs/INTERFACES.md, "Adding a mixer").

Importing this package registers every mixer in MIXERS. Every mixer subclasses
models.mixers.base.Mixer; register refuses one that leaves part of that interface out.
"""
from models.mixers.base import Mixer
from models.mixers.registry import (BASED, DELTANET, GATED_DELTANET, HEDGEHOG, LIGHTNING,
                                    LINEAR, MIXERS, PERFORMER, SLIDING_WINDOW, SOFTMAX,
                                    get_mixer, register)
# Imported for their registration; this order is the order of MIXERS, ALL and FIXED_STATE.
from models.mixers import attention, linear, based, delta, lightning  # noqa: F401

# What a config means by "every mixer" and by "every linear mixer" (those whose decode
# state has a fixed size: all but softmax's KV cache), in registration order.
ALL = tuple(MIXERS)
FIXED_STATE = tuple(name for name, cls in MIXERS.items() if not cls.state_grows)

__all__ = ["ALL", "FIXED_STATE", "MIXERS", "Mixer", "get_mixer", "register",
           "BASED", "DELTANET", "GATED_DELTANET", "HEDGEHOG", "LIGHTNING", "LINEAR",
           "PERFORMER", "SLIDING_WINDOW", "SOFTMAX"]
