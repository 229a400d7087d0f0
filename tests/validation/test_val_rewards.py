from tinyllm.validation.rewards import score


def test_rule_rewards():
    assert score(["exact_match", "prefix_match", "contains", "nonempty"], " blue ", "blue") == {
        "exact_match": 1.0,
        "prefix_match": 1.0,
        "contains": 1.0,
        "nonempty": 1.0,
    }
    assert score(["exact_match", "prefix_match", "contains"], "blue sky", "blue") == {
        "exact_match": 0.0,
        "prefix_match": 1.0,
        "contains": 1.0,
    }
    assert score(["exact_match", "prefix_match", "contains", "nonempty"], "the sky", "blue") == {
        "exact_match": 0.0,
        "prefix_match": 0.0,
        "contains": 0.0,
        "nonempty": 1.0,
    }
    assert score(["prefix_match", "contains"], "anything", "  ") == {"prefix_match": 0.0, "contains": 0.0}


def test_answer_rewards_absent_without_reference():
    assert score(["exact_match", "nonempty"], "", None) == {"nonempty": 0.0}
