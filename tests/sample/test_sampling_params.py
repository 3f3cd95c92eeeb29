import pytest

from ember.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, r"n must be >= 1, got 0"),
        ({"temperature": -0.1}, r"temperature must be in \[0.0, inf\], got -0.1"),
        ({"temperature": float("nan")}, r"temperature .* got nan"),
        ({"temperature": "1"}, r"temperature must be a number, got str"),
        ({"top_p": 0.0}, r"top_p must be in \(0.0, 1.0\], got 0.0"),
        ({"top_p": 1.5}, r"top_p .* got 1.5"),
        ({"top_k": -2}, r"top_k .* got -2"),
        ({"top_k": 2.5}, r"top_k .* got 2.5"),
        ({"min_p": 1.1}, r"min_p must be in \[0.0, 1.0\], got 1.1"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0.0, inf\], got 0.0"),
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2.0, 2.0\], got 2.5"),
        ({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2.0, 2.0\], got -3"),
        ({"logit_bias": {5: 101.0}}, r"logit_bias\[5\] must be in \[-100.0, 100.0\], got 101.0"),
        ({"logit_bias": {"5": 1.0}}, r"logit_bias key must be an int, got str"),
        ({"logit_bias": [1]}, r"logit_bias must be a dict.*got list"),
        ({"seed": 1.5}, r"seed must be an int, got float"),
        ({"seed": 2**64}, r"seed must be in"),
        ({"stop": 5}, r"stop must be a str, a list of str or None, got int"),
        ({"stop": ["ok", 3]}, r"stop must contain only str, got int 3"),
        ({"stop": [""]}, r"stop strings must be non-empty"),
        ({"stop_token_ids": 7}, r"stop_token_ids must be a list of int or None, got int"),
        ({"stop_token_ids": [-1]}, r"stop_token_ids entry must be >= 0, got -1"),
        ({"max_tokens": 0}, r"max_tokens must be >= 1, got 0"),
        ({"min_tokens": -1}, r"min_tokens must be >= 0, got -1"),
        ({"min_tokens": 20, "max_tokens": 10}, r"min_tokens must be <= max_tokens \(10\), got 20"),
        ({"logprobs": 21}, r"logprobs must be in \[0, 20\], got 21"),
        ({"prompt_logprobs": -1}, r"prompt_logprobs must be in \[0, 20\], got -1"),
    ],
)
def test_invalid_fields_raise_naming_field_and_value(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_defaults_and_normalisation() -> None:
    params = SamplingParams(top_k=-1, stop="###", stop_token_ids=(2, 3), max_tokens=None, min_tokens=50)
    assert params.top_k == 0
    assert params.stop == ["###"]
    assert params.stop_token_ids == [2, 3]
    assert SamplingParams().stop == [] and SamplingParams(stop=None).stop == []
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams().max_tokens == 16
    assert not SamplingParams().is_greedy


def test_is_greedy() -> None:
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=0.9, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.9, top_k=2).is_greedy


def test_clone_is_deep_and_replace_revalidates() -> None:
    params = SamplingParams(stop=["a"], logit_bias={1: 2.0})
    copy = params.clone()
    copy.stop.append("b")
    copy.logit_bias[3] = 1.0  # type: ignore[index]
    assert params.stop == ["a"] and params.logit_bias == {1: 2.0}
    hotter = params.replace(temperature=1.5)
    assert hotter.temperature == 1.5 and params.temperature == 1.0
    assert hotter.stop is not params.stop
    with pytest.raises(ValueError, match="top_p"):
        params.replace(top_p=0.0)


def test_validate_for_vocab() -> None:
    SamplingParams(logit_bias={99: 1.0}, stop_token_ids=[0]).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"logit_bias token id 100 .* \[0, 100\)"):
        SamplingParams(logit_bias={100: 1.0}).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"stop_token_ids token id 200"):
        SamplingParams(stop_token_ids=[200]).validate_for_vocab(100)
