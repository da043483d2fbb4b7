"""`python -m tinychat.training stats`: diversity of the user side of the shards."""
from tinychat.training.stats import diversity, normalise


def test_diversity_counts_normalised_messages():
    convs = [[{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "x"},
              {"role": "user", "content": "why ?"}],
             [{"role": "user", "content": "What is rain?"}, {"role": "user", "content": "WHY"}]]
    d = diversity(convs)
    assert normalise("  Why ?! ") == "why"
    assert (d.conversations, d.user_turns, d.distinct_user, d.distinct_openings) == (2, 4, 2, 2)
    assert d.top == [("why", 3)] + [("what is rain", 1)] and d.top_share == 0.75
