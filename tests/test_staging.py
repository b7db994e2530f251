"""``staged_dir``: the published folder's mode, and a swap that never loses the folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from commrl import staging
from commrl.staging import staged_dir


@pytest.fixture
def umask() -> Iterator[None]:
    """Restore the process umask the test changes."""
    mask = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(mask)


def write_version(out: Path, text: str) -> None:
    with staged_dir(out) as stage:
        (stage / "model.txt").write_text(text)


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077], ids=["022", "002", "077"])
def test_the_published_folder_has_the_mode_of_a_plain_mkdir(tmp_path, umask, mask):
    os.umask(mask)
    (tmp_path / "plain").mkdir()
    write_version(tmp_path / "model", "v1")
    mode = (tmp_path / "model").stat().st_mode & 0o777
    assert mode == (tmp_path / "plain").stat().st_mode & 0o777 == 0o777 & ~mask


def test_success_replaces_the_folder_and_an_error_in_the_body_keeps_the_old_one(tmp_path):
    out = tmp_path / "model"
    write_version(out, "v1")
    write_version(out, "v2")
    assert (out / "model.txt").read_text() == "v2" and leftovers(out) == []
    with pytest.raises(RuntimeError), staged_dir(out) as stage:
        (stage / "model.txt").write_text("half")
        raise RuntimeError("boom")
    assert (out / "model.txt").read_text() == "v2" and leftovers(out) == []


def fail_renames(monkeypatch, only_the_second: bool, message: str) -> None:
    """``os.replace`` in ``staging`` fails from its second call on (or on the second call only)."""
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2 or (len(calls) > 2 and not only_the_second):
            raise OSError(message)
        real_replace(src, dst)

    monkeypatch.setattr(staging.os, "replace", replace)


def test_an_error_in_the_second_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    out = tmp_path / "model"
    write_version(out, "v1")
    fail_renames(monkeypatch, only_the_second=True, message="disk gone")  # the stage onto ``out``
    with pytest.raises(OSError, match="disk gone"):
        write_version(out, "v2")
    monkeypatch.undo()
    assert (out / "model.txt").read_text() == "v1" and leftovers(out) == []


def test_a_kill_between_the_renames_is_undone_on_the_next_entry(tmp_path, monkeypatch):
    """A kill after the first rename runs no handler: made here by failing every rename after the first (the
    put-back too), which leaves ``out`` missing and the old version in ``.model.old-*``. The next
    ``staged_dir`` moves it back before its body runs, so even a rerun that fails leaves it in place."""
    out = tmp_path / "model"
    write_version(out, "v1")
    fail_renames(monkeypatch, only_the_second=False, message="killed")
    with pytest.raises(OSError, match="killed"):
        write_version(out, "v2")
    monkeypatch.undo()
    assert not out.exists() and [n[: len(".model.old-")] for n in leftovers(out)] == [".model.old-"]
    with pytest.raises(RuntimeError), staged_dir(out):
        assert (out / "model.txt").read_text() == "v1"
        raise RuntimeError("the rerun fails too")
    assert (out / "model.txt").read_text() == "v1" and leftovers(out) == []


def test_a_leftover_holding_folder_beside_a_present_folder_is_deleted(tmp_path):
    """A kill after the second rename, before the holding folder was removed."""
    out = tmp_path / "model"
    write_version(out, "v2")
    (tmp_path / ".model.old-abcd1234" / "model").mkdir(parents=True)
    (tmp_path / ".model.old-abcd1234" / "model" / "model.txt").write_text("v1")
    (tmp_path / ".model2.old-abcd1234").mkdir()  # another folder's: not touched
    write_version(out, "v3")
    assert (out / "model.txt").read_text() == "v3" and leftovers(out) == []
    assert (tmp_path / ".model2.old-abcd1234").is_dir()


def test_a_stage_a_killed_writer_left_is_deleted_on_the_next_entry(tmp_path):
    """A kill while the stage was written leaves ``.<name>.staging-*`` (for a verl export, gigabytes); the
    next writer of the folder deletes it, and nobody else's."""
    out = tmp_path / "final"
    (tmp_path / ".final.staging-0123abcd").mkdir()
    (tmp_path / ".final.staging-0123abcd" / "model.safetensors").write_text("half")
    (tmp_path / ".final2.staging-0123abcd").mkdir()  # another folder's: not touched
    write_version(out, "v1")
    assert not (tmp_path / ".final.staging-0123abcd").exists() and (out / "model.txt").read_text() == "v1"
    assert (tmp_path / ".final2.staging-0123abcd").is_dir()
