

def test_a_reasoning_gym_task_is_split_as_the_positive_control_splits_it():
    from lmselfplay.spin.data import load_supervised
    from lmselfplay.tasks.task_sets import TaskSet

    config = {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}
    train, held = load_supervised("reasoning_gym:chain_sum", 40, 12, seed=0, config=config)
    control = TaskSet("reasoning_gym:chain_sum", 12, task_config=config).heldout
    assert [r["prompt"] for r in held] == [t.prompt for t in control]
    assert [r["answer"] for r in held] == [f"<answer>{t.answer}</answer>" for t in control]
    assert len(train) == 40 == len({r["prompt"] for r in train})
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert all(r["answer"].startswith("<answer>") and r["final"] is None for r in train)


def test_a_bad_reasoning_gym_source_or_setting_is_one_line():
    import pytest

    from lmselfplay.spin.config import SpinArgs
    from lmselfplay.spin.data import SpinDataError, load_supervised
    from lmselfplay.utils.config import ConfigError

    with pytest.raises(SpinDataError, match="no_such_task"):
        load_supervised("reasoning_gym:no_such_task", 4, 2)
    with pytest.raises(SpinDataError, match="only .* distinct training questions"):
        load_supervised("reasoning_gym:chain_sum", 5000, 2, config={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    with pytest.raises(ConfigError, match="dataset_config must be a JSON object"):
        SpinArgs(dataset_config="[1]")
