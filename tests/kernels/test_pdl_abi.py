"""The ctypes mirrors of the driver's launch structs (kernels/pdl.py) have cuda.h's layout."""

from __future__ import annotations

import ctypes

from verify_tuner.kernels import pdl


def test_launch_attribute_layout():
    assert ctypes.sizeof(pdl._AttrValue) == 64  # char pad[64]
    assert ctypes.sizeof(pdl._Attr) == 72 and pdl._Attr.value.offset == 8  # id, pad to 8, value


def test_launch_config_layout():
    c = pdl._Config
    assert [c.gridDimX.offset, c.blockDimX.offset, c.sharedMemBytes.offset] == [0, 12, 24]
    assert [c.hStream.offset, c.attrs.offset, c.numAttrs.offset, ctypes.sizeof(c)] == [32, 40, 48, 56]


def test_programmatic_serialization_attribute_is_set():
    a = pdl._Attr(id=pdl.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    a.value.programmatic_stream_serialization = 1
    raw = bytes(a)
    assert raw[0] == 6 and raw[8] == 1
