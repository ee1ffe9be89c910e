"""Where the op finds a compiler when no bundle is set: the same search the compiler itself uses
(PATH, then $CUDA_HOME/bin), so a host with nvcc only under CUDA_HOME is not told it has none."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from verify_tuner.engine import op
from verify_tuner.engine.bundle import BundleError
from verify_tuner.kernels import build
from verify_tuner.kernels.config import KernelConfig

CFG = KernelConfig(nsplit=132, ht=8, tk=32, block=256, stages=3, wr=2, wk=2, sf=1, pipe=3)


@pytest.fixture
def no_bundle(monkeypatch, tmp_path):
    monkeypatch.delenv("VERIFY_TUNER_CUBINS", raising=False)
    monkeypatch.setattr(op, "_bundle", None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def fake_nvcc(no_bundle, monkeypatch, tmp_path):
    """An nvcc only under $CUDA_HOME/bin (PATH holds none)."""
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))


def test_nvcc_only_under_cuda_home_compiles(fake_nvcc, monkeypatch):
    calls = []
    monkeypatch.setattr(build, "compile_cubin", lambda *a, **kw: calls.append(a) or SimpleNamespace(cubin=b"\x7fELF"))
    assert op._cubin(CFG, 9, "sm_90", "bf16") == b"\x7fELF"
    assert calls and calls[0][:3] == (CFG, 9, "sm_90")


def test_no_bundle_and_no_nvcc_anywhere_says_both(no_bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    with pytest.raises(BundleError, match=r"no cubin bundle .* and nvcc not found on PATH or in \$CUDA_HOME/bin"):
        op._cubin(CFG, 9, "sm_90", "bf16")


def test_tuner_cache_dir_is_used_by_a_user_with_no_home(fake_nvcc, monkeypatch, tmp_path):
    """A container's arbitrary uid has no home: TUNER_CACHE_DIR, when set, must not need one."""

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(op.Path, "home", staticmethod(no_home))
    calls = []
    monkeypatch.setattr(build, "compile_cubin", lambda *a, **kw: calls.append(a) or SimpleNamespace(cubin=b"\x7fELF"))
    assert op._cubin(CFG, 9, "sm_90", "bf16") == b"\x7fELF" and calls[0][3] == tmp_path / "cache"
    monkeypatch.delenv("TUNER_CACHE_DIR")
    with pytest.raises(BundleError, match="no TUNER_CACHE_DIR to compile into: Could not determine home"):
        op._cubin(CFG, 9, "sm_90", "bf16")


def test_a_cache_this_user_cannot_write_says_what_to_set(fake_nvcc, monkeypatch, tmp_path):
    def denied(*_a, **_kw):  # what the build lock of a folder another user owns raises (root is never refused)
        raise PermissionError(13, "Permission denied", str(tmp_path / "cache" / ".lock"))

    monkeypatch.setattr(build, "compile_cubin", denied)
    with pytest.raises(BundleError, match=r"cannot compile .* \(Permission denied: .*\.lock\): set TUNER_CACHE_DIR"):
        op._cubin(CFG, 9, "sm_90", "bf16")
