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
