from marl_cli.cli.app import overrides_in


def test_overrides_skip_flags_and_their_values():
    args = ["-m", "a=1", "--config-name", "train", "+b=2,3", "-cd", "/x", "~c"]
    assert overrides_in(args) == ["a=1", "+b=2,3", "~c"]
