"""Settings come from TUNER_* variables; a malformed one is an error naming it."""

from __future__ import annotations

import pytest
from verify_tuner.settings import Settings


def test_defaults_and_overrides():
    s = Settings.from_env({})
    assert s.database_url.startswith("sqlite:///") and s.database_read_only is False
    s = Settings.from_env({"TUNER_PORT": "9000", "TUNER_DEVICE": "h200", "TUNER_DATABASE_READ_ONLY": "yes"})
    assert (s.port, s.device, s.database_read_only) == (9000, "h200", True)
    assert Settings.from_env({"TUNER_DATABASE_READ_ONLY": "0"}).database_read_only is False


@pytest.mark.parametrize(
    "env, name",
    [({"TUNER_PORT": "http"}, "TUNER_PORT"), ({"TUNER_DATABASE_READ_ONLY": "maybe"}, "TUNER_DATABASE_READ_ONLY")],
)
def test_malformed_values_name_the_variable(env, name):
    with pytest.raises(ValueError, match=name):
        Settings.from_env(env)
