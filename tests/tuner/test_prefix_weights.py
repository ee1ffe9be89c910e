"""`--prefix-weights FILE`: its formats, how a histogram maps onto the range's buckets, and one
line for every bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verify_tuner import buckets
from verify_tuner.errors import BadPrefixWeights
from verify_tuner.search import prefix_weights

RANGE = buckets.buckets_between(1024, 131072)


def _b(prefix: int) -> int:
    return buckets.bucket_of(prefix).index


def test_equal_by_default_and_every_bucket_of_the_range_present():
    w = prefix_weights.equal(RANGE)
    assert set(w.weights) == {b.index for b in RANGE} and sum(w.weights.values()) == pytest.approx(1.0)
    assert len(set(w.weights.values())) == 1 and w.source == "equal"


@pytest.mark.parametrize(
    "text",
    [
        '{"46000": 3, "4096": 1}',
        "[[4096, 1], [46000, 3]]",
        "\ufeffprefix,weight\n4096,1\n46000,3\n",
        "Prefix , Weight\n46000, 3\n\n4096,1\n",
    ],
)
def test_json_and_csv_give_the_same_weights_and_digest(tmp_path, text):
    path = tmp_path / "w.txt"
    path.write_text(text, encoding="utf-8")
    w = prefix_weights.load(path, RANGE)
    assert w.weights[_b(46000)] == pytest.approx(0.75) and w.weights[_b(4096)] == pytest.approx(0.25)
    assert w.weights[_b(1024)] == 0 and w.outside == 0
    ref = prefix_weights.from_histogram([(4096, 1), (46000, 3)], RANGE, source="x")
    assert w.digest == ref.digest != prefix_weights.equal(RANGE).digest


def test_prefixes_in_one_bucket_add_up_and_outside_the_range_count_at_its_ends(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"46000": 1, "40000": 1, "10": 1, "1000000": 1}))
    w = prefix_weights.load(path, RANGE)
    assert w.weights[_b(46000)] == pytest.approx(0.5)
    assert w.weights[RANGE[0].index] == pytest.approx(0.25) and w.weights[RANGE[-1].index] == pytest.approx(0.25)
    assert w.outside == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "header `prefix,weight`"),
        ("{", "not valid JSON"),
        ('{"46000": 1, "46000": 2}', "prefix 46000 is given twice"),
        ("[[46000, 1], [46000, 2]]", "prefix 46000 is given twice"),
        ('{"abc": 1}', "prefix must be an integer"),
        ('{"-5": 1}', "prefix must be an integer"),
        ('{"46000": -1}', "weight must be a finite number >= 0"),
        ('{"46000": "NaN"}', "weight must be a finite number >= 0"),
        ('{"46000": true}', "weight must be a finite number"),
        ('{"46000": 0}', "sum to 0"),
        ("{}", "no entries"),
        ("[1, 2]", "expected an object"),
        ("prefix,count\n1,2\n", "header `prefix,weight`"),
        ("prefix,weight\n1,2,3\n", "line 2: expected prefix,weight"),
        ("prefix,weight\n1.5,2\n", "line 2: prefix must be an integer"),
        ('{"\u00b2": 5}', "prefix must be an integer"),  # isdigit(), not a number
        ('{"\u0661\u0660\u0660\u0660": 5}', "prefix must be an integer"),  # Arabic-Indic 1000: not ours
        ("prefix,weight\n\u00b2,5\n", "line 2: prefix must be an integer"),
        ("prefix,weight\n46000,\u0665\n", "line 2: weight must be a finite number"),
        ('{"46000": ' + "9" * 5000 + "}", "not a histogram"),  # more digits than int() converts
        ("prefix,weight\n" + "9" * 5000 + ",1\n", r"prefix must be an integer in 0\.\.\d+, got '9{30}"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("prefix,weight\n46000," + "1" * 200_000 + "\n", "not CSV the reader takes"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path, text, match):
    path = tmp_path / "w.csv"
    path.write_text(text)
    with pytest.raises(BadPrefixWeights, match=match) as exc:
        prefix_weights.load(path, RANGE)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_unreadable_and_binary_files(tmp_path):
    with pytest.raises(BadPrefixWeights, match="cannot read"):
        prefix_weights.load(tmp_path / "missing.json", RANGE)
    (tmp_path / "b").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(BadPrefixWeights, match="not UTF-8"):
        prefix_weights.load(tmp_path / "b", RANGE)


def test_an_endless_file_is_refused_after_the_bound_not_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(prefix_weights, "MAX_FILE_BYTES", 1024)
    with pytest.raises(BadPrefixWeights, match="more than 1024 bytes"):
        prefix_weights.load(Path("/dev/zero"), RANGE)
