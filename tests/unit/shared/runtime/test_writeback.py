"""`WriteBack`: the kernel's write-back started every `EVERY` bytes written, over the range not yet started."""

from __future__ import annotations

from gpuyard.shared.runtime import writeback
from gpuyard.shared.runtime.uploadfile import UploadFile


def test_each_range_is_started_once_it_is_every_bytes_long(monkeypatch):
    calls = []
    monkeypatch.setattr(
        writeback, "_CALL", lambda fd, offset, length, flags: calls.append((fd, offset, length))
    )
    monkeypatch.setattr(writeback, "EVERY", 10)
    back = writeback.WriteBack(7)
    for n in (4, 4, 4, 20, 1):
        back.wrote(n)
    assert calls == [(7, 0, 12), (7, 12, 20)]


def test_an_upload_file_starts_the_write_back_of_what_it_wrote(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        writeback, "_CALL", lambda fd, offset, length, flags: calls.append((offset, length, flags))
    )
    monkeypatch.setattr(writeback, "EVERY", 4)
    upload = UploadFile(tmp_path)
    upload.write(b"abcdef")
    upload.write(memoryview(b"gh"))
    upload.close()
    assert upload.path.read_bytes() == b"abcdefgh"
    assert calls == [(0, 6, writeback.SYNC_FILE_RANGE_WRITE)]


def test_the_call_is_found_on_linux():
    assert writeback._CALL is not None
