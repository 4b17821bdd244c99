"""The weights behind the attention pictures (shapes, rows summing to 1, causal zeros, the
search's cross-attention equal to a teacher-forced pass) and `aiayn attention` writing every
picture and the page."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from aiayn.cli import main as cli
from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import Translator
from aiayn.errors import UserError
from aiayn.viz.figures import alignment_figure, figure_bytes, heatmap_figure, lines_figure, save_figure
from aiayn.viz.maps import collect_attention
from aiayn.viz.page import attention_page

from helpers import reverser_model_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return reverser_model_dir(tmp_path_factory.mktemp("viz"))


@pytest.fixture(scope="module")
def translator(model_path):
    return Translator(load_model(model_path), precision="fp32", warn=lambda m: None)  # fp32 references


def _check_rows(w: np.ndarray) -> None:
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert (w >= 0).all()


@pytest.mark.slow
def test_maps_from_the_search_and_teacher_forced(translator):
    maps = collect_attention(translator, "the cat sat on the mat")
    s, t = len(maps.src_pieces), len(maps.out_pieces)
    assert maps.from_search and maps.src_pieces[-1] == "</s>" and maps.dec_pieces[0] == "<s>"
    assert maps.target == translator.translate(["the cat sat on the mat"])[0]
    assert maps.encoder.shape == (2, 4, s, s)
    assert maps.decoder.shape == (2, 4, t, t) and len(maps.dec_pieces) == t
    assert maps.cross.shape == (2, 4, t, s)
    for w in (maps.encoder, maps.decoder, maps.cross):
        _check_rows(w)
    assert (np.triu(maps.decoder, k=1) == 0).all()  # causal: no position sees a later one
    # The same output read teacher-forced: every weight agrees with the search's.
    forced = collect_attention(translator, "the cat sat on the mat", maps.target)
    if forced.out_pieces == maps.out_pieces:  # the text re-encodes to the same pieces
        assert not forced.from_search
        np.testing.assert_allclose(forced.cross, maps.cross, atol=1e-5)
        np.testing.assert_allclose(forced.decoder, maps.decoder, atol=1e-6)
    given = collect_attention(translator, "a dog", "ein hund läuft")
    assert given.out_pieces[-1] == "</s>" and given.target == "ein hund läuft"
    assert given.cross.shape[2:] == (len(given.out_pieces), len(given.src_pieces))
    with pytest.raises(UserError, match="empty"):
        collect_attention(translator, "   ")


def test_heatmap_labels_every_piece_of_a_long_sentence():
    pieces = [f"\u2581w{i}" for i in range(50)]
    w = np.random.default_rng(0).dirichlet(np.ones(50), size=(2, 50))  # (2 heads, 50, 50)
    fig = heatmap_figure(w, pieces, pieces, "t", ["head 1", "head 2"], "query", "key")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == pieces
    assert [t.get_text() for t in ax.get_yticklabels()] == pieces
    width, height = fig.get_size_inches()
    assert width >= 2 * 50 * 0.13 and height >= 50 * 0.13  # room for every 8-point label
    fig = lines_figure(w, pieces, pieces, "t", ["head 1", "head 2"], "query", "key")
    assert len(fig.axes[0].collections) == 2  # one set of lines per head
    assert fig.get_size_inches()[1] >= 50 * 0.2


def test_save_figure_formats(tmp_path):
    fig = heatmap_figure(np.eye(3)[None], list("abc"), list("abc"), "t", ["h"], "q", "k")
    assert save_figure(fig, tmp_path / "a.png").read_bytes().startswith(PNG_MAGIC)
    assert b"<svg" in save_figure(fig, tmp_path / "a.svg").read_bytes()
    with pytest.raises(UserError, match="jpg"):
        save_figure(fig, tmp_path / "a.jpg")


def test_alignment_heatmap_for_the_api(translator):
    a = translator.align(["the children play in the garden"])[0]
    fig = alignment_figure(a)
    ax = fig.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), a.attention)
    assert [t.get_text() for t in ax.get_yticklabels()] == a.tgt_pieces
    pieces = len(a.tgt_pieces) - (a.tgt_pieces[-1] == "</s>")
    assert len(ax.patches) == len(a.piece_links()) == pieces  # one outlined cell per piece
    assert figure_bytes(fig).startswith(PNG_MAGIC) and b"<svg" in figure_bytes(fig, "svg")


def test_page_embeds_the_weights(translator):
    maps = collect_attention(translator, "the children play </script> <b>")
    page = attention_page(maps, "T")
    data = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert json.loads(data.group(1)) == json.loads(json.dumps(maps.to_dict()))
    assert "&lt;/script&gt;" in page  # the source is escaped in the text
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page and "src=" not in page  # nothing to fetch


@pytest.mark.slow
def test_attention_command(model_path, tmp_path, capsys):
    out = tmp_path / "att"
    args = ["attention", "--model", str(model_path), "--src", "the cat sat on the mat",
            "--out", str(out)]
    assert cli(args) == 0
    names = sorted(p.name for p in out.iterdir())
    kinds = ["cross", "cross-lines", "decoder", "decoder-lines", "encoder", "encoder-lines"]
    assert names == sorted(["attention.html"] + [f"{k}.layer2.{f}" for k in kinds
                                                 for f in ("png", "svg")])
    for p in out.iterdir():
        data = p.read_bytes()
        assert len(data) > 1000
        assert data.startswith(PNG_MAGIC) if p.suffix == ".png" else data.lstrip().startswith(b"<")
    capsys.readouterr()
    assert cli(args) == 2  # existing files are kept
    assert "--overwrite" in capsys.readouterr().err
    assert cli(args[:-2] + ["--out", str(out), "--tgt", "ein hund", "--layer", "1", "--head", "-1",
                            "--formats", "png", "--no-html"]) == 0
    assert (out / "cross.layer1.head4.png").read_bytes().startswith(PNG_MAGIC)
    assert cli(args + ["--layer", "3", "--overwrite"]) == 2
    assert cli(args + ["--formats", "gif", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "--layer 3: the model has 2 layers" in err and "gif" in err and "Traceback" not in err
