"""Writers are atomic: a failure mid-write leaves the old record byte-identical and no temporary behind."""

from __future__ import annotations

import os

import pytest


def _boom(*_args, **_kwargs):
    raise OSError("simulated crash before the rename")


def test_failed_write_leaves_old_record_byte_identical_and_no_temp_files(
    any_file_spec, tmp_path, monkeypatch
):
    spec = any_file_spec
    path = spec.locate(tmp_path)
    spec.write(tmp_path, spec.make(0))
    before = path.read_bytes()
    listing = sorted(path.parent.iterdir())

    with monkeypatch.context() as patch, pytest.raises(OSError, match="simulated crash"):
        patch.setattr(os, "replace", _boom)
        spec.write(tmp_path, spec.make(1))

    assert path.read_bytes() == before
    assert sorted(path.parent.iterdir()) == listing == [path]
    spec.write(tmp_path, spec.make(1))
    assert path.read_bytes() != before


def test_failed_first_write_leaves_nothing(any_file_spec, tmp_path, monkeypatch):
    path = any_file_spec.locate(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(os, "replace", _boom)
    with pytest.raises(OSError):
        any_file_spec.write(tmp_path, any_file_spec.make(0))
    assert list(path.parent.iterdir()) == []
