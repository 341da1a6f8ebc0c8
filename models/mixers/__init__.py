"""Sequence mixers, registered by name (see docs/INTERFACES.md, "Adding a mixer").

Importing this package registers every mixer in MIXERS. Every mixer subclasses
models.mixers.base.Mixer; register refuses one that leaves part of that interface out.
"""
from models.mixers.base import Mixer
from models.mixers.registry import (BASE_CONV, BASED, DELTANET, GATED_CONV, GATED_DELTANET,
                                    HEDGEHOG, HEDGEHOG_WINDOW, LIGHTNING, LINEAR, MIXERS,
                                    PERFORMER, SLIDING_WINDOW, SOFTMAX, TAYLOR, get_mixer,
                                    register)
# Imported for their registration; this order is the order of MIXERS, ALL and FIXED_STATE.
from models.mixers import (attention, linear, based, delta, lightning, base_conv,  # noqa: F401
                           lolcats)

# Mixers that are a hybrid's building block, not a sequence model on their own (the gated
# convs see only their 3 taps): named in layer patterns, left out of ALL so that a sweep
# over "every mixer" does not train a conv-only model.
PARTS = (BASE_CONV, GATED_CONV)

# What a config means by "every mixer" and by "every linear mixer" (those whose decode
# state has a fixed size: all but softmax's KV cache), in registration order.
ALL = tuple(name for name in MIXERS if name not in PARTS)
FIXED_STATE = tuple(name for name in ALL if not MIXERS[name].state_grows)

__all__ = ["ALL", "FIXED_STATE", "MIXERS", "PARTS", "Mixer", "get_mixer", "register",
           "BASE_CONV", "BASED", "DELTANET", "GATED_CONV", "GATED_DELTANET", "HEDGEHOG",
           "HEDGEHOG_WINDOW", "LIGHTNING", "LINEAR", "PERFORMER", "SLIDING_WINDOW", "SOFTMAX",
           "TAYLOR"]
