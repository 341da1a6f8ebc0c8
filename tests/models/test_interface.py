"""The one mixer interface: every registered mixer implements all of it, register
refuses a class that does not, and the registry's constants name every mixer."""
import pytest

from models import mixers
from models.mixers import base, registry


@pytest.mark.parametrize("name", sorted(mixers.MIXERS))
def test_every_mixer_implements_the_interface(name):
    cls = mixers.get_mixer(name)
    assert issubclass(cls, base.Mixer) and cls.name == name
    assert base.missing_methods(cls) == []


def test_register_refuses_an_incomplete_or_foreign_class():
    class Partial(base.Mixer):
        def __call__(self, x, *, segment_ids=None):
            return x

    with pytest.raises(TypeError, match="init_state, prefill, step, state_size, "
                                        "flops_per_token"):
        registry.register("partial")(Partial)
    with pytest.raises(TypeError, match="must subclass"):
        registry.register("foreign")(type("Foreign", (), {}))
    assert "partial" not in mixers.MIXERS and "foreign" not in mixers.MIXERS


def test_constants_and_groups_name_the_registry():
    constants = ("SOFTMAX", "SLIDING_WINDOW", "LINEAR", "PERFORMER", "HEDGEHOG", "TAYLOR",
                 "BASED", "GATED_DELTANET", "DELTANET", "LIGHTNING", "BASE_CONV",
                 "GATED_CONV", "HEDGEHOG_WINDOW")
    names = {getattr(mixers, c) for c in constants}
    assert names == set(mixers.MIXERS) == set(mixers.ALL) | set(mixers.PARTS)
    assert mixers.PARTS == (mixers.BASE_CONV, mixers.GATED_CONV)
    assert not set(mixers.PARTS) & set(mixers.ALL)
    assert set(mixers.FIXED_STATE) == set(mixers.ALL) - {mixers.SOFTMAX}
