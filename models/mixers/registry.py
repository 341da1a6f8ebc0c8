"""One registry of mixers by name: `register(NAME)` on a class, `get_mixer(name)`.

The names are constants here, so mixers register under them and configs and tests name
a mixer through them: a misspelt constant fails at import, a misspelt string only when a
run asks for it.
"""
from __future__ import annotations

from models.mixers.base import Mixer, missing_methods

SOFTMAX = "softmax"
SLIDING_WINDOW = "sliding_window"
LINEAR = "linear"
PERFORMER = "performer"
HEDGEHOG = "hedgehog"
HEDGEHOG_WINDOW = "hedgehog_window"
BASED = "based"
GATED_DELTANET = "gated_deltanet"
DELTANET = "deltanet"
LIGHTNING = "lightning"
TAYLOR = "taylor"
BASE_CONV = "base_conv"
GATED_CONV = "gated_conv"

MIXERS: dict[str, type] = {}


def register(name: str):
    """Class decorator: MIXERS[name] = cls, once per name, for complete Mixers only."""
    def wrap(cls):
        if name in MIXERS:
            raise ValueError(f"mixer {name!r} registered twice ({MIXERS[name]} and {cls})")
        if not issubclass(cls, Mixer):
            raise TypeError(f"mixer {name!r}: {cls.__name__} must subclass "
                            f"models.mixers.base.Mixer")
        missing = missing_methods(cls)
        if missing:
            raise TypeError(f"mixer {name!r}: {cls.__name__} does not implement "
                            f"{', '.join(missing)} (models.mixers.base.Mixer)")
        MIXERS[name] = cls
        cls.name = name
        return cls
    return wrap


def get_mixer(name: str) -> type:
    try:
        return MIXERS[name]
    except KeyError:
        raise ValueError(f"Unknown mixer {name!r}; valid names: "
                         f"{', '.join(sorted(MIXERS))}.") from None
