"""A key's text form (a study's workload_key attribute, the study name) and its parse."""

from __future__ import annotations

import pytest
from verify_tuner.keys import ConfigKey


@pytest.mark.parametrize("batch_bucket", [0, 3])
def test_a_key_parses_back_from_its_text(batch_bucket):
    key = ConfigKey("NVIDIA H200", "abc123", "bf16", 8, 9, 14, batch_bucket)
    text = str(key)
    assert ("|B" in text) == bool(batch_bucket)  # B=1 keys keep their pre-batch form
    assert ConfigKey.parse(text) == key
