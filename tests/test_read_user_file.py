"""yamlsrc.read_user_file: the one place files the user names are read (cluster files, recipes, imports)."""

from __future__ import annotations

import os

import pytest

from sparkconsole.bench.benchy_io import import_file
from sparkconsole.bench.results import ResultsStore
from sparkconsole.errors import UserError
from sparkconsole.yamlsrc import load_file, read_user_file


def test_reads_up_to_the_limit_and_refuses_beyond(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"a" * 100)
    assert read_user_file(f, 100) == b"a" * 100
    with pytest.raises(UserError, match=r"x\.bin: file larger than 99 bytes"):
        read_user_file(f, 99)


def test_a_device_is_refused_without_being_read_whole():
    with pytest.raises(UserError, match="larger than 4096 bytes"):
        read_user_file("/dev/zero", 4096)


@pytest.mark.parametrize("reader", [lambda p: read_user_file(p, 10), load_file,
                                    lambda p: import_file(ResultsStore(p.parent / "r.sqlite"), p)],
                         ids=["read_user_file", "load_file", "import_file"])
def test_missing_directory_and_unreadable_are_one_line_errors(tmp_path, reader):
    with pytest.raises(UserError, match="nothing.json: file not found") as exc:
        reader(tmp_path / "nothing.json")
    assert "\n" not in str(exc.value)
    d = tmp_path / "dir.json"
    d.mkdir()
    with pytest.raises(UserError, match=r"dir\.json: cannot read \(Is a directory\)"):
        reader(d)
    if os.geteuid() != 0:          # root reads anything
        f = tmp_path / "locked.json"
        f.write_text("{}")
        f.chmod(0)
        with pytest.raises(UserError, match="cannot read"):
            reader(f)
