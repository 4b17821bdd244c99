"""`aiayn translate --glossary`: a line holding a source term gets its target term in every
output mode, a line without one translates as without the glossary, and a bad glossary or a term
that cannot fit is one line; interactive mode at a terminal shows each translation as it
settles, and ends on exactly the translation it would write otherwise."""

from __future__ import annotations

import io
import json
import sys

import pytest

from aiayn.cli import main as cli_main
from aiayn.commands.translate import CLEAR_LINE, show_settling
from aiayn.data.model_dir import load_model
from aiayn.decoding.documents import split_sentences, translate_paragraphs
from aiayn.decoding.glossary import Glossary
from aiayn.decoding.translate import Translator, translate_settling

from helpers import reverser_model_dir

# "cat" -> "garten": a target term the reverser (which writes its source's pieces backwards)
# does not write for these lines by itself; "the children" -> "die katze": two words each side.
PAIRS = [("cat", "garten"), ("the children", "die katze")]
LINES = ["the cat sat on the mat", "a dog runs in the park", "", "the children play in the garden",
         "die katze sitzt"]
HAS_TERM = [True, False, False, True, False]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return reverser_model_dir(tmp_path_factory.mktemp("reverser"))


@pytest.fixture(scope="module")
def translator(model):
    return Translator(load_model(model), precision="fp32")


@pytest.fixture
def files(tmp_path):
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("# term<TAB>translation\n\n" + "".join(f"{s}\t{t}\n" for s, t in PAIRS),
                        encoding="utf-8")
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    return glossary, src


def translate(capsys, model, *args) -> tuple[int, str, str]:
    code = cli_main(["translate", "--model", str(model), "--precision", "fp32", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def by_line(nbest: str) -> dict[int, list[tuple[str, str]]]:
    """`--nbest` output: input line -> its (score, text) rows."""
    out: dict[int, list[tuple[str, str]]] = {}
    for row in nbest.split("\n")[:-1]:
        index, score, text = row.split("\t")
        out.setdefault(int(index), []).append((score, text))
    return out


def targets(line: str) -> list[str]:
    return [t for s, t in PAIRS if s in line]


def test_text_output_holds_the_terms_and_is_unchanged_without_them(model, files, capsys,
                                                                   translator):
    glossary, src = files
    code, plain, _ = translate(capsys, model, "--input", src)
    assert code == 0
    code, fixed, err = translate(capsys, model, "--input", src, "--glossary", glossary)
    assert code == 0, err
    plain, fixed = plain.split("\n")[:-1], fixed.split("\n")[:-1]
    assert len(fixed) == len(LINES)
    for line, has, a, b in zip(LINES, HAS_TERM, plain, fixed):
        if has:
            assert all(t in b for t in targets(line)), (line, b)
            assert not all(t in a for t in targets(line))  # the glossary made the difference
        else:
            assert b == a, line  # no term: the search as without a glossary
    assert fixed == translator.translate(LINES, glossary=Glossary.of(PAIRS))


def test_nbest_and_jsonl_hold_the_terms(model, files, capsys):
    glossary, src = files
    code, out, err = translate(capsys, model, "--input", src, "--glossary", glossary,
                               "--nbest", 2)
    assert code == 0, err
    fixed = by_line(out)
    assert sorted(fixed) == list(range(len(LINES)))
    for i, rows in fixed.items():
        assert all(t in text for _, text in rows for t in targets(LINES[i])), rows
    code, plain, _ = translate(capsys, model, "--input", src, "--nbest", 2)
    plain = by_line(plain)
    assert [fixed[i] == plain[i] for i in range(len(LINES))] == [not h for h in HAS_TERM]

    code, out, err = translate(capsys, model, "--input", src, "--glossary", glossary,
                               "--format", "jsonl", "--nbest", 2)
    assert code == 0, err
    records = [json.loads(line) for line in out.split("\n")[:-1]]
    assert [r["src"] for r in records] == LINES
    for r in records:
        assert all(t in h["tgt"] for h in r["nbest"] for t in targets(r["src"]))
    code, plain, _ = translate(capsys, model, "--input", src, "--format", "jsonl", "--nbest", 2)
    for r, p in zip(records, map(json.loads, plain.split("\n")[:-1])):
        if not targets(r["src"]):
            assert r == p


def test_documents_take_each_sentences_own_terms(model, files, capsys, translator):
    glossary, _ = files
    paragraphs = ["a dog runs in the park! the cat sat on the mat.", "",
                  "the children play in the garden? die katze sitzt."]
    src = files[1].with_name("paragraphs.txt")
    src.write_text("".join(p + "\n" for p in paragraphs), encoding="utf-8")
    code, out, err = translate(capsys, model, "--input", src, "--documents", "--glossary",
                               glossary)
    assert code == 0, err
    g = Glossary.of(PAIRS)
    # each paragraph: its sentences translated alone, each with its own terms, joined
    expected = [" ".join(t for t in translator.translate(split_sentences(p), glossary=g) if t)
                for p in paragraphs]
    assert out.split("\n")[:-1] == expected
    assert "garten" in expected[0] and "die katze" in expected[2]


def test_a_sentence_cut_into_parts_takes_each_parts_own_terms(model):
    # 7 pieces a part: "the children" is cut between its words, "the cat sat" is one part
    tr = Translator(load_model(model), precision="fp32", max_src_tokens=8)
    paragraph = "the children play in the garden and the cat sat on the mat"
    plain = translate_paragraphs(tr, [paragraph])[0]
    (fixed,) = translate_paragraphs(tr, [paragraph], glossary=Glossary.of(PAIRS))
    assert "garten" in fixed and "garten" not in plain
    assert "die katze" not in fixed  # a term across a cut applies to neither part


def test_a_malformed_glossary_is_one_line_before_any_model(tmp_path, capsys):
    bad = tmp_path / "terms.tsv"
    bad.write_text("cat\tgarten\nno tab here\n", encoding="utf-8")
    # no model directory at all: the glossary is read first
    code, out, err = translate(capsys, tmp_path / "no-model", "--glossary", bad)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(bad) in err and "line 2" in err, err
    code, _, err = translate(capsys, tmp_path / "no-model", "--glossary", tmp_path / "none.tsv")
    assert code == 2 and err.count("\n") == 1 and "none.tsv" in err, err


def test_glossary_with_alignment_is_refused(tmp_path, files, capsys):
    glossary, src = files
    code, _, err = translate(capsys, tmp_path / "no-model", "--input", src, "--glossary",
                             glossary, "--alignment", "hard")
    assert code == 2 and err.count("\n") == 1 and "--glossary" in err and "--alignment" in err


def test_terms_that_cannot_fit_are_one_line_naming_the_line(model, tmp_path, capsys,
                                                            monkeypatch):
    long = tmp_path / "long.tsv"
    long.write_text("dog\t" + " ".join(["garten"] * 60) + "\n", encoding="utf-8")
    src = tmp_path / "in.txt"
    src.write_text("the cat\na dog runs\n", encoding="utf-8")
    for mode in ([], ["--nbest", "2"], ["--format", "jsonl"], ["--documents"]):
        code, _, err = translate(capsys, model, "--input", src, "--glossary", long, *mode)
        assert code == 2 and err.count("\n") == 1, (mode, err)
        assert err.startswith("aiayn translate: error: line 2:") and "Traceback" not in err
    # interactive: the line is skipped with one line on stderr, the session goes on
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a dog runs\nthe cat\n")))
    code, out, err = translate(capsys, model, "--interactive", "--glossary", long)
    assert code == 0 and out.count("\n") == 1
    assert err.count("error:") == 1 and "error: line 1: " in err and "skipped" in err


def test_settled_prefixes_grow_and_end_in_the_translation(translator):
    g = Glossary.of(PAIRS)
    seen = 0
    for glossary in (None, g):
        for line in LINES:
            shown: list[list[int]] = []
            hyps = translate_settling(translator, line, shown.append, glossary)
            final = hyps[0].tokens
            assert all(len(a) < len(b) for a, b in zip(shown, shown[1:]))  # growing
            assert all(final[: len(p)] == p for p in shown)  # each a prefix of the final
            seen += len(shown)
            writer = Writer()
            show_settling(writer, translator, line, glossary, width=80)
            assert writer.writes[-1].endswith("\n")
            text = writer.text().split(CLEAR_LINE)[-1]
            assert text == translator.translate([line], glossary=glossary)[0] + "\n"
            assert writer.text().count("\n") == 1
    assert seen  # some prefix settled before its sentence ended: the test is not vacuous


def test_a_prefix_wider_than_the_terminal_stays_on_one_row(translator):
    line = LINES[3]
    shown: list[list[int]] = []
    translate_settling(translator, line, shown.append)
    assert shown
    writer = Writer()
    show_settling(writer, translator, line, width=4)
    partial = [w[len(CLEAR_LINE):] for w in writer.writes if not w.endswith("\n")]
    assert partial and all(len(p) <= 3 for p in partial)
    assert writer.writes[-1] == CLEAR_LINE + translator.translate([line])[0] + "\n"


class Writer:
    """Records what it is given, as a terminal would receive it."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self.writes)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_interactive_streams_only_at_a_terminal(model, files, capsys, monkeypatch, translator):
    glossary, _ = files
    g = Glossary.of(PAIRS)
    typed = "".join(line + "\n" for line in LINES).encode()
    expected = translator.translate(LINES, glossary=g)
    # a pipe: only the final lines, as without streaming
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(typed)))
    code, out, err = translate(capsys, model, "--interactive", "--glossary", glossary)
    assert code == 0, err
    assert out == "".join(t + "\n" for t in expected)
    # a terminal: each line ends in its translation, drawn over what settled before it
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(typed)))
    term = Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    assert cli_main(["translate", "--model", str(model), "--precision", "fp32", "--interactive",
                     "--glossary", str(glossary)]) == 0
    rows = term.getvalue().split("\n")[:-1]
    assert [row.split(CLEAR_LINE)[-1] for row in rows] == expected
    assert CLEAR_LINE in term.getvalue()
