"""Files the CLI writes never go through a link another user planted: `configs export -o` and
`configs dump --out-dir` into a sticky world-writable folder (/tmp) where `nobody` planted
`configs.json -> /.../secret.conf` replaced root's secret with JSON, 0644. The kernel's
fs.protected_symlinks never saw it: the writer resolved the link itself. The CLI as processes."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.helpers import run_tuner

NOBODY = 65534
ROW = {"device": "h200", "H": 8, "q_len": 9, "prefix": 46000, "NSPLIT": 64, "HT": 8, "TK": 32, "BLOCK": 256}
ROW |= {"STAGES": 2, "QT": 0, "WR": 2, "WK": 4, "SF": 0, "PIPE": 1}
DUMPED = "H=8,q_len=9,device_name=NVIDIA_H200,dtype=bf16.json"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="planting a link as another user takes root (CI is root)")


@pytest.fixture
def place(tmp_path):  # type: ignore[no-untyped-def]
    """A tuned database, root's secret (0600) and a sticky world-writable folder, as /tmp is."""
    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    (tmp_path / "row.json").write_text(json.dumps([ROW]))
    for args in (("db", "upgrade"), ("configs", "import", str(tmp_path / "row.json"))):
        assert run_tuner(env, *args).returncode == 0
    secret = tmp_path / "secret.conf"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return env, secret, shared


def _plant(link, target) -> None:  # type: ignore[no-untyped-def]
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)  # as `nobody` would have made it


def _untouched(secret) -> bool:  # type: ignore[no-untyped-def]
    return secret.read_text() == "root's secret\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_export_refuses_a_link_another_user_planted(place):
    env, secret, shared = place
    _plant(shared / "configs.json", secret)
    r = run_tuner(env, "configs", "export", "-o", str(shared / "configs.json"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "symbolic link owned by uid 65534" in r.stderr and "planted" in r.stderr, r.stderr
    assert _untouched(secret)


def test_dump_refuses_a_link_another_user_planted(place):
    env, secret, shared = place
    _plant(shared / DUMPED, secret)
    r = run_tuner(env, "configs", "dump", "--out-dir", str(shared))
    assert r.returncode == 1 and "symbolic link owned by uid 65534" in r.stderr, r.stderr
    assert _untouched(secret)


def test_a_link_of_ones_own_is_still_followed(place, tmp_path):
    """An operator's own `configs.json -> /etc/tuner/configs.json` writes the target, as before."""
    env, _, shared = place
    target = tmp_path / "real.json"
    (shared / "mine.json").symlink_to(target)
    r = run_tuner(env, "configs", "export", "-o", str(shared / "mine.json"))
    assert r.returncode == 0, r.stderr
    assert (shared / "mine.json").is_symlink() and json.loads(target.read_text())[0]["NSPLIT"] == 64
