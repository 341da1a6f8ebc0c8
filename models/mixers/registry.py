"""One registry of mixers by name: `register("name")` on a class, `get_mixer("name")`."""
from __future__ import annotations

MIXERS: dict[str, type] = {}


def register(name: str):
    def wrap(cls):
        if name in MIXERS:
            raise ValueError(f"mixer {name!r} registered twice ({MIXERS[name]} and {cls})")
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
