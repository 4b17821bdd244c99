"""WMT 2014 English-German and English-French, the paper's data (§5.1): where the corpora are, and
how `aiayn download wmt14` turns the published archives into the plain text `aiayn prepare` reads.

Training data, as used for the paper (tensor2tensor's WMT 2014 problems):
- EN-DE, about 4.5M pairs: Europarl v7, Common Crawl, News Commentary v9;
- EN-FR, about 36M pairs after cleaning (40.8M before): the same three, the UN corpus
  (undoc.2000) and the 10^9 French-English corpus (giga-fren).
Dev set newstest2013, test set newstest2014 (the full 3,003 sentences, as sacreBLEU's `wmt14/full`),
both from WMT's development archive (data.statmt.org/wmt19/translation-task/dev.tgz, which holds
every newstest up to 2018).

Every archive comes from statmt.org with the SHA-256 of its bytes and its size (the checksums
tensorflow-datasets publishes for the same URLs). The output directory then holds:
- `archives/`: the verified archives (kept, so that a re-run extracts again without downloading);
- `train.{src,tgt}`: the training corpora concatenated in the order above, one sentence a line;
- `newstest2013.{src,tgt}`, `newstest2014.{src,tgt}`: dev and test, one sentence a line (the test
  set's SGML segments unescaped);
- `wmt14-{pair}.json`: what each file holds (corpora, line counts, SHA-256).

Lines are kept as published, except that the rare line that is not valid UTF-8 has its bad bytes
replaced by U+FFFD (counted in the JSON file), and every file ends with a newline.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from tqdm import tqdm

from aiayn.checks import sha256_file
from aiayn.data.corpus import decode_utf8, sgml_segments
from aiayn.errors import UserError
from aiayn.files import atomic_write
from aiayn.recipes.download import Remote, fetch

WMT13, WMT14 = "http://www.statmt.org/wmt13", "http://www.statmt.org/wmt14"
ARCHIVES: dict[str, Remote] = {
    "europarl-v7": Remote(
        "training-parallel-europarl-v7.tgz", f"{WMT13}/training-parallel-europarl-v7.tgz",
        "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7", 657632379),
    "commoncrawl": Remote(
        "training-parallel-commoncrawl.tgz", f"{WMT13}/training-parallel-commoncrawl.tgz",
        "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5", 918311367),
    "news-commentary-v9": Remote(
        "training-parallel-nc-v9.tgz", f"{WMT14}/training-parallel-nc-v9.tgz",
        "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485", 80418416),
    "un": Remote(
        "training-parallel-un.tgz", f"{WMT13}/training-parallel-un.tgz",
        "29141b5c1eba149a94f7a59d3b1a834b2e47fe0f8758d68dcd77a3d3f497ee47", 2365634246),
    "giga-fren": Remote(
        "training-giga-fren.tar", "http://www.statmt.org/wmt10/training-giga-fren.tar",
        "3ff8319f6919393520559bfbc7ad6a747ec81b3abc7be9993b338d4b017b4d9a", 2595102720),
    "dev": Remote(
        "dev.tgz", "http://data.statmt.org/wmt19/translation-task/dev.tgz",
        "7a7deccf82ebb05ba508dba5eb21356492224e8f630ec4f992132b029b4b25e7", 38654961),
}


@dataclass(frozen=True)
class Corpus:
    """One parallel corpus inside an archive: the member holding each language's side."""

    name: str
    archive: str  # key of ARCHIVES
    members: dict[str, str]  # language -> path inside the archive (".gz": gzipped; ".sgm": SGML)


def _corpora(pair: str) -> dict[str, list[Corpus]]:
    """The training, dev and test corpora of `pair` ("en-de" or "en-fr"), by output file stem."""
    x = pair.split("-")[1]
    train = [
        Corpus("europarl-v7", "europarl-v7",
               {lang: f"training/europarl-v7.{x}-en.{lang}" for lang in ("en", x)}),
        Corpus("commoncrawl", "commoncrawl", {lang: f"commoncrawl.{x}-en.{lang}" for lang in ("en", x)}),
        Corpus("news-commentary-v9", "news-commentary-v9",
               {lang: f"training/news-commentary-v9.{x}-en.{lang}" for lang in ("en", x)}),
    ]
    if x == "fr":
        train += [
            Corpus("un", "un", {lang: f"un/undoc.2000.fr-en.{lang}" for lang in ("en", "fr")}),
            Corpus("giga-fren", "giga-fren",
                   {lang: f"giga-fren.release2.fixed.{lang}.gz" for lang in ("en", "fr")}),
        ]
    return {
        "train": train,
        "newstest2013": [Corpus("newstest2013", "dev", {lang: f"dev/newstest2013.{lang}" for lang in ("en", x)})],
        "newstest2014": [Corpus("newstest2014", "dev", {
            "en": f"dev/newstest2014-{x}en-src.en.sgm", x: f"dev/newstest2014-{x}en-ref.{x}.sgm"})],
    }


PAIRS = ("en-de", "en-fr")


# --- extraction ---------------------------------------------------------------------------------


def _normal(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def write_text_lines(stream: IO[bytes], out: IO[bytes]) -> tuple[int, int]:
    """Copy a text stream to `out` line by line: (lines, lines whose invalid UTF-8 was replaced by
    U+FFFD). A missing final newline is added."""
    lines = replaced = 0
    carry = b""
    while True:
        block = stream.read(1 << 22)
        data = carry + block
        cut = data.rfind(b"\n") + 1 if block else len(data)
        carry, data = data[cut:], data[:cut]
        if data:
            if not data.endswith(b"\n"):
                data += b"\n"
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:  # rare: repair line by line
                fixed = []
                for line in data.split(b"\n")[:-1]:
                    good = line.decode("utf-8", "replace").encode("utf-8")
                    replaced += good != line
                    fixed.append(good)
                data = b"\n".join(fixed) + b"\n"
            lines += data.count(b"\n")
            out.write(data)
        if not block:
            return lines, replaced


def _sgml_to_lines(stream: IO[bytes], out: IO[bytes], where: str) -> tuple[int, int]:
    segments = sgml_segments(decode_utf8(stream.read(), where), where)
    out.write("".join(s.replace("\n", " ") + "\n" for s in segments).encode("utf-8"))
    return len(segments), 0


def extract_members(archive: Path, wanted: dict[str, Path], progress: bool = True) -> dict[str, dict]:
    """Read a tar archive (gzipped or not) once, front to back, writing each member named in
    `wanted` (path inside the archive -> destination) as text lines; {member: {"lines", "replaced"}}.
    A member ending in ".gz" is gunzipped, one ending in ".sgm" becomes its segments."""
    found: dict[str, dict] = {}
    size = archive.stat().st_size
    with open(archive, "rb") as raw, tqdm.wrapattr(raw, "read", total=size, desc=f"extract {archive.name}",
                                                   disable=None if progress else True, leave=False) as f:
        try:
            with tarfile.open(fileobj=f, mode="r|*") as tar:
                for member in tar:
                    name = _normal(member.name)
                    if name not in wanted or not member.isfile():
                        continue
                    stream = tar.extractfile(member)
                    if name.endswith(".gz"):
                        stream = gzip.GzipFile(fileobj=stream)
                    convert = _sgml_to_lines if name.endswith(".sgm") else (
                        lambda s, o, _: write_text_lines(s, o))
                    with atomic_write(wanted[name], "wb") as out:
                        lines, replaced = convert(stream, out, f"{archive.name}:{name}")
                    found[name] = {"lines": lines, "replaced": replaced}
        except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise UserError(f"{archive}: cannot read the archive ({e}); delete it and download again") from None
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise UserError(f"{archive}: has no member {missing[0]}; is it the right archive?")
    return found


def _concatenate(parts: list[Path], dest: Path) -> None:
    with atomic_write(dest, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    out.write(chunk)


# --- the whole download -------------------------------------------------------------------------


def download_wmt14(pair: str, out_dir: str | os.PathLike, base_url: str | None = None,
                   archives: dict[str, Remote] | None = None, progress: bool = True,
                   log: Callable[[str], None] = lambda msg: None) -> dict:
    """Fetch and unpack WMT 2014 `pair` into `out_dir` (layout in the module docstring); returns
    what `wmt14-{pair}.json` records. `base_url` fetches every archive from one mirror
    (`base_url/NAME`); `archives` replaces the table of archives (tests: fixtures)."""
    if pair not in PAIRS:
        raise UserError(f"unknown WMT 2014 pair {pair!r}; choose from {', '.join(PAIRS)}")
    table = archives or ARCHIVES
    out = Path(out_dir)
    record_path = out / f"wmt14-{pair}.json"
    corpora = _corpora(pair)
    langs = pair.split("-")
    if record_path.exists():
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if all((out / f).is_file() and sha256_file(out / f) == v["sha256"] for f, v in record["files"].items()):
            log(f"{out} is up to date ({record_path.name})")
            return record
    # Replace only files an earlier download here wrote (its record lists them), never a user's.
    ours = set(record["files"]) if record_path.exists() else set()
    for stem in corpora:
        for lang in langs:
            dest = out / f"{stem}.{lang}"
            if os.path.lexists(dest) and dest.name not in ours:
                raise UserError(f"{dest} exists and was not written by aiayn download (it is not "
                                f"in {record_path.name}); move it away, or choose another --out")

    needed = sorted({c.archive for cs in corpora.values() for c in cs})
    paths = {}
    for key in needed:
        remote = table[key].at(base_url)
        log(f"fetching {remote.url}")
        paths[key] = fetch(remote, out / "archives" / remote.name, progress)

    work = out / ".extract"
    work.mkdir(parents=True, exist_ok=True)
    lines: dict[str, dict] = {}  # corpus name -> what it holds
    by_archive: dict[str, list[Corpus]] = {}
    for c in (c for cs in corpora.values() for c in cs):
        by_archive.setdefault(c.archive, []).append(c)
    for key, cs in by_archive.items():
        wanted = {c.members[lang]: work / f"{c.name}.{lang}" for c in cs for lang in langs}
        log(f"extracting {len(wanted)} files from {paths[key].name}")
        found = extract_members(paths[key], wanted, progress)
        for c in cs:
            n = [found[c.members[lang]]["lines"] for lang in langs]
            if n[0] != n[1]:
                raise UserError(f"{paths[key]}: {c.name} has {n[0]} {langs[0]} lines but {n[1]} "
                                f"{langs[1]} lines")
            lines[c.name] = {"corpus": c.name, "archive": table[key].name, "lines": n[0],
                             "replaced_lines": {lang: found[c.members[lang]]["replaced"] for lang in langs}}

    files: dict[str, dict] = {}
    for stem, cs in corpora.items():  # the corpora in the table's order
        for lang in langs:
            dest = out / f"{stem}.{lang}"
            _concatenate([work / f"{c.name}.{lang}" for c in cs], dest)
            files[dest.name] = {"sha256": sha256_file(dest), "lines": sum(lines[c.name]["lines"] for c in cs)}
    shutil.rmtree(work)
    record = {"pair": pair, "splits": {stem: [lines[c.name] for c in cs] for stem, cs in corpora.items()},
              "files": files, "archives": {table[k].name: table[k].sha256 for k in needed}}
    with atomic_write(record_path) as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    log(f"{out}: " + ", ".join(f"{stem} {files[f'{stem}.{langs[0]}']['lines']:,} pairs" for stem in corpora))
    return record
