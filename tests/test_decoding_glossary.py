"""Glossaries (aiayn/decoding/glossary.py): which terms apply to a sentence, and the file's one
format, every malformed line refused in one line naming it."""

from __future__ import annotations

import pytest

from aiayn.decoding.glossary import Glossary, read_glossary
from aiayn.errors import UserError


def test_terms_match_whole_words_case_sensitively_longest_first():
    g = Glossary.of([("York", "York"), ("New York", "New York City"), ("dog", "Hund"),
                     ("e-mail", "E-Mail")])
    assert g.terms("A dog in New York.") == ["Hund", "New York City"]
    assert g.terms("hotdogs and Dog") == []  # inside a word; another case
    assert g.terms("York, then dog, dog again") == ["York", "Hund"]  # text order, each once
    assert g.terms("send an e-mail.") == ["E-Mail"]
    assert Glossary.of([]).terms("anything") == []


def test_an_entry_needs_both_terms():
    with pytest.raises(ValueError, match="source and a target"):
        Glossary.of([("dog", " ")])


def test_the_file_format(tmp_path):
    f = tmp_path / "g.tsv"
    f.write_text("# terms\n\ndog\tHund\n  cat \t Katze \n", encoding="utf-8")
    assert read_glossary(f).entries == (("dog", "Hund"), ("cat", "Katze"))


@pytest.mark.parametrize("line", ["dog Hund", "dog\tHund\tchien", "\tHund", "dog\t "])
def test_a_malformed_line_is_one_line_naming_it(tmp_path, line):
    f = tmp_path / "g.tsv"
    f.write_text(f"cat\tKatze\n{line}\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"line 2: expected 'source term<TAB>target term'") as e:
        read_glossary(f)
    assert "\n" not in str(e.value)


def test_missing_and_binary_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        read_glossary(tmp_path / "absent.tsv")
    (tmp_path / "bin.tsv").write_bytes(b"dog\t\xff\xfe\n")
    with pytest.raises(UserError, match="not UTF-8"):
        read_glossary(tmp_path / "bin.tsv")
