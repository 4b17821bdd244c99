"""`aiayn download wmt14`: small fixture archives laid out like statmt.org's (tgz, a tar of gzip
files, SGML test sets), served from 127.0.0.1; unpacked into what `aiayn prepare` reads."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from aiayn.data.corpus import ParallelSource
from aiayn.data.dataset import ParallelDataset
from aiayn.data.prepare import PrepareOptions, prepare_dataset
from aiayn.errors import UserError
from aiayn.recipes.download import Remote
from aiayn.recipes.wmt14 import ARCHIVES, download_wmt14, write_text_lines

from helpers import serve

REPO = Path(__file__).resolve().parents[1]


def tar_bytes(members: dict[str, bytes], gz: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def lines(prefix: str, n: int, lang: str) -> list[str]:
    return [f"{prefix} {lang} {i} &" for i in range(n)]


def text(ls: list[str]) -> bytes:
    return "".join(s + "\n" for s in ls).encode()


def sgml(segments: list[str]) -> bytes:
    esc = [s.replace("&", "&amp;").replace("<", "&lt;") for s in segments]
    body = "".join(f'<seg id="{i + 1}">{s}</seg>\n' for i, s in enumerate(esc))
    return f'<refset setid="newstest2014">\n<doc docid="a">\n{body}</doc>\n</refset>\n'.encode()


def fixture_archives(x: str) -> tuple[dict[str, bytes], dict[str, list[str]]]:
    """Archives for the pair en-x (file name -> bytes), and the lines each output file must hold."""
    ep = {lang: lines("europarl", 5, lang) for lang in ("en", x)}
    cc = {lang: lines("crawl", 4, lang) for lang in ("en", x)}
    nc = {lang: lines("news", 3, lang) for lang in ("en", x)}
    dev = {lang: lines("dev2013", 3, lang) for lang in ("en", x)}
    test = {lang: [f"test <{lang}> {i} & co" for i in range(2)] for lang in ("en", x)}
    files = {
        "training-parallel-europarl-v7.tgz": tar_bytes({
            **{f"training/europarl-v7.{x}-en.{lang}": text(ep[lang]) for lang in ("en", x)},
            "training/europarl-v7.cs-en.cs": b"other pair\n",  # not ours: skipped
        }),
        # Common Crawl's members sit at the top level
        "training-parallel-commoncrawl.tgz": tar_bytes(
            {f"commoncrawl.{x}-en.{lang}": text(cc[lang]) for lang in ("en", x)}),
        "training-parallel-nc-v9.tgz": tar_bytes(
            {f"./training/news-commentary-v9.{x}-en.{lang}": text(nc[lang]) for lang in ("en", x)}),
        "dev.tgz": tar_bytes({
            **{f"dev/newstest2013.{lang}": text(dev[lang]) for lang in ("en", x)},
            f"dev/newstest2014-{x}en-src.en.sgm": sgml(test["en"]),
            f"dev/newstest2014-{x}en-ref.{x}.sgm": sgml(test[x]),
        }),
    }
    train = {lang: ep[lang] + cc[lang] + nc[lang] for lang in ("en", x)}
    if x == "fr":
        un = {lang: lines("un", 2, lang) for lang in ("en", "fr")}
        giga = {lang: lines("giga", 6, lang) for lang in ("en", "fr")}
        files["training-parallel-un.tgz"] = tar_bytes(
            {f"un/undoc.2000.fr-en.{lang}": text(un[lang]) for lang in ("en", "fr")})
        # giga-fren: an uncompressed tar of gzipped files
        files["training-giga-fren.tar"] = tar_bytes(
            {f"giga-fren.release2.fixed.{lang}.gz": gzip.compress(text(giga[lang])) for lang in ("en", "fr")},
            gz=False)
        train = {lang: train[lang] + un[lang] + giga[lang] for lang in ("en", "fr")}
    expected = {f"train.{lang}": train[lang] for lang in ("en", x)}
    expected |= {f"newstest2013.{lang}": dev[lang] for lang in ("en", x)}
    expected |= {f"newstest2014.{lang}": test[lang] for lang in ("en", x)}
    return files, expected


def table_for(files: dict[str, bytes], url: str) -> dict[str, Remote]:
    """The real table of archives with the fixtures' checksums, sizes and address."""
    return {key: Remote(r.name, f"{url}/{r.name}", hashlib.sha256(files[r.name]).hexdigest(),
                        len(files[r.name]))
            for key, r in ARCHIVES.items() if r.name in files}


@pytest.mark.parametrize("x", ["de", "fr"])
def test_download_unpacks_every_corpus_in_order(tmp_path, x):
    files, expected = fixture_archives(x)
    out = tmp_path / "wmt"
    with serve(files) as s:
        record = download_wmt14(f"en-{x}", out, archives=table_for(files, s.url), progress=False)
        n_requests = len(s.requests)
        again = download_wmt14(f"en-{x}", out, archives=table_for(files, s.url), progress=False)
        assert len(s.requests) == n_requests  # up to date: nothing fetched or unpacked again
    assert again == record
    assert n_requests == len(files)  # each archive once (dev.tgz serves dev and test)
    for name, want in expected.items():
        assert (out / name).read_text(encoding="utf-8").splitlines() == want, name
        assert record["files"][name]["lines"] == len(want)
        assert record["files"][name]["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    names = [c["corpus"] for c in record["splits"]["train"]]
    assert names == ["europarl-v7", "commoncrawl", "news-commentary-v9"] + (["un", "giga-fren"] if x == "fr" else [])
    assert sorted(p.name for p in out.iterdir()) == sorted([*expected, "archives", f"wmt14-en-{x}.json"])
    assert json.loads((out / f"wmt14-en-{x}.json").read_text()) == record


def test_the_download_feeds_prepare(tmp_path):
    files, expected = fixture_archives("de")
    out = tmp_path / "wmt"
    with serve(files) as s:
        download_wmt14("en-de", out, archives=table_for(files, s.url), progress=False)
    sp = {"train": ParallelSource(out / "train.en", out / "train.de"),
          "valid": ParallelSource(out / "newstest2013.en", out / "newstest2013.de"),
          "test": ParallelSource(out / "newstest2014.en", out / "newstest2014.de")}
    chars = set("".join(expected["train.en"] + expected["train.de"]))  # a character vocabulary
    prepare_dataset(tmp_path / "ds", sp, PrepareOptions("en", "de", vocab_size=len(chars) + 4, model_type="char"),
                    progress=False)
    test = ParallelDataset(tmp_path / "ds", "test")
    assert test.reference_lines() == expected["newstest2014.de"]
    assert len(ParallelDataset(tmp_path / "ds", "train")) == len(expected["train.en"])


def test_a_corrupt_archive_or_a_misaligned_corpus_is_a_user_error(tmp_path):
    files, _ = fixture_archives("de")
    bad = dict(files)
    bad["training-parallel-nc-v9.tgz"] = tar_bytes({
        "training/news-commentary-v9.de-en.en": b"one\ntwo\n", "training/news-commentary-v9.de-en.de": b"eins\n"})
    with serve(bad) as s:
        with pytest.raises(UserError, match=r"news-commentary-v9 has 2 en lines but 1 de lines"):
            download_wmt14("en-de", tmp_path / "a", archives=table_for(bad, s.url), progress=False)
    bad["training-parallel-nc-v9.tgz"] = tar_bytes({"training/news-commentary-v9.de-en.en": b"x\n"})
    with serve(bad) as s:
        with pytest.raises(UserError, match=r"has no member training/news-commentary-v9\.de-en\.de"):
            download_wmt14("en-de", tmp_path / "b", archives=table_for(bad, s.url), progress=False)
    bad["training-parallel-nc-v9.tgz"] = files["training-parallel-nc-v9.tgz"][:100]  # truncated
    with serve(bad) as s:
        with pytest.raises(UserError, match="cannot read the archive"):
            download_wmt14("en-de", tmp_path / "c", archives=table_for(bad, s.url), progress=False)


def test_text_lines_repair_invalid_utf8_and_end_with_a_newline():
    out = io.BytesIO()
    data = b"gut\nschlecht \xc3\x28 hier\n\xffb\nlast without newline"
    assert write_text_lines(io.BytesIO(data), out) == (4, 2)
    assert out.getvalue().decode("utf-8").split("\n") == [
        "gut", "schlecht \ufffd( hier", "\ufffdb", "last without newline", ""]


def test_archive_table_is_complete():
    for r in ARCHIVES.values():
        assert len(r.sha256) == 64 and r.size > 1_000_000 and "statmt.org" in r.url
        assert r.url.endswith("/" + r.name) and not r.text


def test_cli_checksum_mismatch_is_one_line(tmp_path):
    files, _ = fixture_archives("de")  # the real names, but not the real archives' checksums
    with serve(files) as s:
        r = subprocess.run([sys.executable, "-m", "aiayn", "download", "wmt14", "--pair", "en-de",
                            "--out", str(tmp_path / "o"), "--base-url", s.url, "--no-progress"],
                           capture_output=True, text=True, cwd=REPO,
                           env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("aiayn download: error: ")
    assert "checksum mismatch" in r.stderr


def script_commands(**env) -> list[list[str]]:
    """The commands scripts/wmt14.sh runs, from its DRY_RUN listing."""
    import os
    import shlex

    r = subprocess.run(["bash", str(REPO / "scripts" / "wmt14.sh")], capture_output=True, text=True,
                       env={"PATH": os.environ["PATH"], "DRY_RUN": "1", **env}, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return [shlex.split(line[2:]) for line in r.stderr.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("pair,model,preset,n_avg", [("en-de", "base", "base", 5), ("en-de", "big", "big", 20),
                                                     ("en-fr", "big", "big-enfr", 20)])
def test_recipe_script_runs_valid_commands(pair, model, preset, n_avg):
    from aiayn.cli import build_parser
    from aiayn.presets import get_preset

    cmds = script_commands(PAIR=pair, MODEL=model, GPUS="1")
    parser = build_parser()
    parsed = {}
    for cmd in cmds:
        if cmd[0].endswith("torchrun"):
            launcher = cmd[:cmd.index("-m")]
            assert launcher[launcher.index("--nproc_per_node") + 1] == "1"
            cmd = cmd[cmd.index("-m") + 2:]
        else:
            cmd = cmd[1:]
        parsed[cmd[0]] = parser.parse_args(cmd)  # every command is one aiayn accepts
    assert list(parsed) == ["download", "prepare", "train", "average", "translate", "evaluate"]
    train = parsed["train"]
    assert train.preset == preset and train.precision == "bf16" and train.save_minutes == 10
    # one GPU: 2 micro-batches of 12,500 tokens make the paper's 25,000-token update
    assert train.accum == 2 and get_preset(preset).max_tokens == 25000
    assert parsed["average"].last == n_avg == get_preset(preset).n_average
    assert parsed["prepare"].vocab_size == (37000 if pair == "en-de" else 32000)
    assert parsed["evaluate"].lang == pair[-2:] and parsed["download"].pair == pair
    assert parsed["translate"].input.endswith("data/test.src.txt")


def test_recipe_script_on_many_nodes():
    cmds = script_commands(STAGES="train", NNODES="2", NODE_RANK="1", MASTER_ADDR="node0", GPUS="8")
    (torchrun,) = cmds
    opts = dict(zip(torchrun[1:torchrun.index("-m"):2], torchrun[2:torchrun.index("-m"):2]))
    assert opts == {"--nnodes": "2", "--nproc_per_node": "8", "--node_rank": "1", "--master_addr": "node0",
                    "--master_port": "29500"}
    assert torchrun[torchrun.index("--accum") + 1] == "1"  # 16 GPUs x 1,563 tokens: one micro-batch
