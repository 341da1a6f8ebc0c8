"""scripts/convert_compare's token budget: a conversion and its from-scratch run get at
most token_fraction of the tokens the teacher had seen at the converted checkpoint (the
same batch, so steps), split between the two stages."""
import pytest

from scripts.convert_compare import stage_steps


@pytest.mark.parametrize("teacher_step", [250, 1250, 1500, 1750, 4999])
@pytest.mark.parametrize("fraction, share", [(0.1, 0.5), (0.1, 0.8), (0.05, 0.5)])
def test_the_budget_never_exceeds_the_fraction(teacher_step, fraction, share):
    first, second = stage_steps(teacher_step, fraction, share)
    assert first >= 1 and second >= 1
    assert first + second <= teacher_step * fraction < first + second + 1
    assert abs(first - share * (first + second)) <= 0.5


def test_nanogpt_teachers_best_step():
    # tiny-Shakespeare's char teacher is best near step 1,500 (docs/results.md section 5)
    assert stage_steps(1500, 0.1, 0.5) == (75, 75)


def test_too_few_steps_to_split_is_refused():
    with pytest.raises(SystemExit):
        stage_steps(10, 0.1, 0.5)


def test_table_interval_is_the_t_interval_at_any_count():
    # six values: mean 1.25, sample sd sqrt(0.035) = 0.187083; t(0.975, 5) = 2.570582
    # (any t-table), so the half-width is 2.570582 * 0.187083 / sqrt(6) = 0.196339
    from scripts.convert_compare import _interval
    assert _interval([1.0, 1.1, 1.2, 1.3, 1.4, 1.5]) == "1.2500 +- 0.1963"
    assert _interval([1.4697]) == "1.4697"  # one value: no interval
