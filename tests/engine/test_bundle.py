"""The cubin bundle an inference host loads without nvcc (tuner/engine/bundle.py): written by nvcc here,
read back, and refused when it is for another kernel or damaged."""

from __future__ import annotations

import json
import os
import shutil
import stat
from types import SimpleNamespace

import pytest
from verify_tuner.engine import bundle as bundle_mod
from verify_tuner.engine.bundle import MANIFEST, Bundle, BundleError, Item, write_bundle
from verify_tuner.kernels.config import KernelConfig

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
CFG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    write_bundle(
        root,
        [Item(CFG, 9, "bf16", "sm_90"), Item(CFG, 9, "bf16", "sm_120"), Item(CFG, 9, "bf16", "sm_90")],
        cache_dir=tmp_path_factory.mktemp("cache"),
    )
    return root


@needs_nvcc
def test_written_once_per_entry_readable_by_everyone_and_read_back(bundle):
    manifest = json.loads((bundle / MANIFEST).read_text())
    got = [(e["arch"], e["kv_dtype"], e["q_len"]) for e in manifest["entries"]]
    assert got == [("sm_120", "bf16", 9), ("sm_90", "bf16", 9)]
    for path in bundle.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    b = Bundle.open(bundle)
    assert b.cubin(CFG, 9, "sm_90")[:4] == b"\x7fELF"
    with pytest.raises(BundleError, match="no cubin for .* q_len=16 reading bf16 on sm_90"):
        b.cubin(CFG, 16, "sm_90")
    # a cubin reads one KV format: a bf16 build is not one for an e4m3 cache
    assert b.has(CFG, 9, "sm_90", "bf16") and not b.has(CFG, 9, "sm_90", "fp8_e4m3")
    with pytest.raises(BundleError, match="no cubin for .* q_len=9 reading fp8_e4m3 on sm_90"):
        b.cubin(CFG, 9, "sm_90", "fp8_e4m3")


@needs_nvcc
def test_a_damaged_cubin_or_another_kernel_is_refused(bundle, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    victim = copy / manifest["entries"][0]["file"]
    data = victim.read_bytes()
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(BundleError, match="does not match its manifest"):
        Bundle.open(copy).cubin(CFG, 9, manifest["entries"][0]["arch"])
    manifest["kernel_hash"] = "0" * 16
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="for kernel 0000000000000000"):
        Bundle.open(copy)


def test_a_missing_bundle_says_so(tmp_path):
    with pytest.raises(BundleError, match="no cubin bundle"):
        Bundle.open(tmp_path / "nowhere")


@pytest.mark.parametrize(("umask", "dirs", "files"), [(0o077, 0o700, 0o600), (0o022, 0o755, 0o644)])
def test_the_bundle_follows_the_umask(tmp_path, monkeypatch, umask, dirs, files):
    """`configs dump --cubins` writes what the operator's umask allows, as any command they run does:
    under 077 it was 0644 all the same."""
    monkeypatch.setattr(
        bundle_mod, "compile_cubin", lambda cfg, q_len, arch, cache, kv_dtype: SimpleNamespace(cubin=b"\x7fELF")
    )
    root = tmp_path / "engine" / "cubins"
    old = os.umask(umask)
    try:
        write_bundle(root, [Item(CFG, 9, "bf16", "sm_90")], cache_dir=tmp_path / "cache")
    finally:
        os.umask(old)
    assert [stat.S_IMODE(p.stat().st_mode) for p in (root.parent, root)] == [dirs, dirs]
    assert {stat.S_IMODE(p.stat().st_mode) for p in root.iterdir()} == {files}
    assert Bundle.open(root).cubin(CFG, 9, "sm_90") == b"\x7fELF"


def test_a_cubin_missing_from_a_partly_copied_bundle_is_a_bundle_error(tmp_path, monkeypatch):
    monkeypatch.setattr(
        bundle_mod, "compile_cubin", lambda cfg, q_len, arch, cache, kv_dtype: SimpleNamespace(cubin=b"\x7fELF")
    )
    write_bundle(tmp_path / "b", [Item(CFG, 9, "bf16", "sm_90")], cache_dir=tmp_path / "cache")
    (cubin,) = (tmp_path / "b").glob("*.cubin")
    cubin.unlink()  # the manifest arrived, the cubin did not
    with pytest.raises(BundleError, match=f"cannot read {cubin} of the bundle \\(FileNotFoundError"):
        Bundle.open(tmp_path / "b").cubin(CFG, 9, "sm_90")


@pytest.mark.parametrize(
    "manifest",
    [
        [],
        {"kernel_hash": "K"},
        {"kernel_hash": "K", "entries": [{"arch": "sm_90"}]},
        {"kernel_hash": "K", "entries": 3},
    ],
    ids=["a list", "no entries", "an entry without config", "entries not a list"],
)
def test_a_manifest_of_the_wrong_shape_is_a_bundle_error(tmp_path, monkeypatch, manifest):
    monkeypatch.setattr(bundle_mod, "kernel_hash", lambda: "K")
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="manifest"):
        Bundle.open(tmp_path)


def test_an_entry_without_its_file_is_refused_when_the_bundle_opens(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_mod, "kernel_hash", lambda: "K")
    entry = {"arch": "sm_90", "kv_dtype": "bf16", "q_len": 9, "config": CFG.as_params(), "sha256": "0" * 64}
    (tmp_path / MANIFEST).write_text(json.dumps({"kernel_hash": "K", "entries": [entry]}))
    with pytest.raises(BundleError, match="malformed .*no file name"):
        Bundle.open(tmp_path)


def test_a_manifest_nested_past_the_parsers_depth_is_a_bundle_error(tmp_path):
    """It raised RecursionError out of Bundle.open, and so out of the worker client's fetch()."""
    (tmp_path / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BundleError, match="unreadable cubin bundle manifest .*RecursionError"):
        Bundle.open(tmp_path)
