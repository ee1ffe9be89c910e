"""Issue 30 item 11: every config the worker client serves passes validate() for its device."""

from __future__ import annotations

import json

from tests.api.test_engine_files import ROWS, _tuner


def test_another_gpus_table_under_this_gpus_file_name_is_not_served(tmp_path):
    """Issue 30 item 11: the H200's table saved under the A100's file name was served, its configs
    needing more shared memory than an A100 has. The client checks every config against its device."""
    from verify_tuner.engine.client import ConfigClient
    from verify_tuner.engine_files import file_name
    from verify_tuner.kernels import kernel_hash
    from verify_tuner.kernels.limits import known_device
    from verify_tuner.kernels.validate import check
    from verify_tuner.keys import TableKey

    env = {"TUNER_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    assert _tuner(env, "db", "upgrade").returncode == 0
    (tmp_path / "rows.json").write_text(json.dumps([ROWS[0]]))  # HT=8 TK=32 STAGES=2: 205 KB, the A100 has 163
    assert _tuner(env, "configs", "import", str(tmp_path / "rows.json")).returncode == 0, "row not importable"
    out = tmp_path / "out"
    assert _tuner(env, "configs", "dump", "--out-dir", str(out)).returncode == 0
    a100 = known_device("a100")
    h200_file = out / file_name(TableKey("NVIDIA H200", kernel_hash(), "bf16", 8, 9))
    a100_file = out / file_name(TableKey(a100.name, kernel_hash(), "bf16", 8, 9))
    h200_file.rename(a100_file)
    client = ConfigClient(None, H=8, q_len=9, device=a100.name, config_dir=out, snapshot_dir=tmp_path / "snap")
    assert client.fetch() == "heuristic", client.reason
    assert "table is for device 'NVIDIA H200'" in client.reason  # the file says whose it is
    # its device edited too: every config is still checked against the device it would run on
    doc = json.loads(a100_file.read_text())
    a100_file.write_text(json.dumps(doc | {"device_name": a100.name}))
    client = ConfigClient(None, H=8, q_len=9, device=a100.name, config_dir=out, snapshot_dir=tmp_path / "snap")
    assert client.fetch() == "heuristic", client.reason
    assert f"cannot run on {a100.name}" in client.reason
    assert all(check(c, a100, H=8, q_len=9) is None for c in client.distinct_configs())
