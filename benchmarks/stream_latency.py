"""Streaming's first words: how soon `aiayn serve` shows a translation's first settled words, and
that streaming costs the other requests nothing.

Starts `aiayn serve` on 127.0.0.1 (a free port; bench_serve.py's start), picks the `--n` source
sentences whose word count is closest to `--words`, and measures:

1. One client at a time, per sentence: a plain request's latency, and a streamed request's time
   to the first `prefix` event with non-empty text ("first words"; the final event's time where
   no such prefix came before it) and to the final event; the two requests alternate which goes
   first. Reported: the medians, and the median over sentences of first words / plain latency.
   The plain request's time to its response headers is reported too: the server sends them
   with the body, so a body that comes well after them is a stall on the connection (TCP
   segments held back), not decoding.
2. `--clients` concurrent clients (closed loop, keep-alive), each sending `--per-client` of the
   sentences one request at a time, all streamed, then all plain: p50 and p99 of the time to the
   final answer, to show that streaming leaves the tail where it was.

Every streamed final translation is compared with the plain one of the same sentence (the
search is the same with or without streaming: docs/guides/serving.md).

    .venv/bin/python benchmarks/stream_latency.py --model runs/m30k/model \\
        --sentences runs/m30k/data/test.src.txt --words 20 --n 30 --clients 32 \\
        --out runs/stream_latency.json

Loopback only: the server binds 127.0.0.1 and the clients connect there. Run it alone on the
machine: the clients share the CPU with the server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench_serve import add_server_arguments, closed_loop, machine, start_server  # noqa: E402

from aiayn.files import atomic_write  # noqa: E402

from provenance import stamp, stamp_line  # noqa: E402


def pick(lines: list[str], words: int, n: int) -> list[str]:
    """The `n` distinct non-blank lines whose word count is closest to `words` (earlier lines
    first among equals), in file order."""
    seen: dict[str, int] = {}
    for i, s in enumerate(lines):
        if s.strip() and s not in seen:
            seen[s] = i
    best = sorted(seen, key=lambda s: (abs(len(s.split()) - words), seen[s]))[:n]
    return sorted(best, key=seen.__getitem__)


def plain(conn: http.client.HTTPConnection, text: str, fields: dict
          ) -> tuple[float, float, str | None]:
    """(seconds to the response's headers, seconds to its whole body, translation or None on
    failure) of one request without streaming; `fields`: the request's other fields."""
    start = time.perf_counter()
    conn.request("POST", "/translate", json.dumps({**fields, "q": text}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    headers = time.perf_counter() - start
    body = r.read()
    seconds = time.perf_counter() - start
    return headers, seconds, (json.loads(body).get("translatedText") if r.status == 200 else None)


def streamed(conn: http.client.HTTPConnection, text: str, fields: dict
             ) -> tuple[float | None, float, str | None]:
    """(seconds to the first prefix with text or None, seconds to the final event, translation
    or None) of one streamed request, its events read as they arrive."""
    start = time.perf_counter()
    conn.request("POST", "/translate", json.dumps({**fields, "q": text, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        r.read()
        return None, time.perf_counter() - start, None
    first, event, data = None, None, None
    while True:
        line = r.readline()
        if not line:  # the stream ended without a final event
            return first, time.perf_counter() - start, None
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith("event:"):
            event = line[len("event:"):].strip()
        elif line.startswith("data:"):
            data = json.loads(line[len("data:"):])
        elif not line and event is not None:  # a blank line ends an event
            now = time.perf_counter() - start
            if event == "prefix" and first is None and data["text"].strip():
                first = now
            elif event in ("done", "error"):
                r.read()  # the end of the chunked body: the connection is ready again
                return first, now, data.get("translatedText") if event == "done" else None
            event, data = None, None


def one_at_a_time(port: int, sentences: list[str], fields: dict, timeout: float
                  ) -> list[dict]:
    """Per sentence: plain latency, streamed first words and final, both translations."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    rows = []
    for k, s in enumerate(sentences):
        row: dict = {"sentence": s, "words": len(s.split()), "plain_first": k % 2 == 0}
        for kind in (("plain", "streamed") if k % 2 == 0 else ("streamed", "plain")):
            if kind == "plain":
                row["plain_headers_s"], row["plain_s"], row["plain_text"] = plain(conn, s, fields)
            else:
                first, final, text = streamed(conn, s, fields)
                row["first_words_came_with_final"] = first is None
                row["first_words_s"] = final if first is None else first
                row["streamed_final_s"], row["streamed_text"] = final, text
        rows.append(row)
    conn.close()
    return rows


def client(port: int, work: list[str], stream: bool, fields: dict, out: list,
           timeout: float) -> None:
    """Send each sentence in turn; append (sentence, seconds to the final answer, translation
    or None) to `out`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    for s in work:
        start = time.perf_counter()
        try:
            text = (streamed if stream else plain)(conn, s, fields)[2]
        except (OSError, http.client.HTTPException, ValueError):
            text = None
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        out.append((s, time.perf_counter() - start, text))
    conn.close()


def concurrent(port: int, sentences: list[str], n_clients: int, per_client: int, stream: bool,
               fields: dict, timeout: float) -> tuple[dict, list]:
    """`n_clients` closed-loop clients, `per_client` requests each: the level's figures and its
    (sentence, seconds, translation) results."""
    results, wall = closed_loop(n_clients, per_client, sentences,
                                lambda w, out: client(port, w, stream, fields, out, timeout))
    ok = sorted(r[1] for r in results if r[2] is not None)
    q = (statistics.quantiles(ok, n=100, method="inclusive") if len(ok) > 1
         else ok * 99 or [None] * 99)
    return ({"streamed": stream, "clients": n_clients, "requests": len(results),
             "failed": len(results) - len(ok), "seconds": round(wall, 3),
             "p50_s": q[49] and round(q[49], 4), "p99_s": q[98] and round(q[98], 4)}, results)


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def show(v: float | None, unit: str = " s", digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}{unit}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--sentences", required=True, help="source sentences, one a line")
    p.add_argument("--words", type=int, default=20, help="the word count to pick near (20)")
    p.add_argument("--n", type=int, default=30, help="how many sentences (30)")
    p.add_argument("--clients", type=int, default=32, help="concurrent clients (32)")
    p.add_argument("--per-client", type=int, default=8,
                   help="requests each concurrent client sends (8)")
    p.add_argument("--beam-size", type=int,
                   help="every request's beam size (default: the model's; 1 is greedy, which "
                        "settles a piece at every step)")
    add_server_arguments(p, reference=False)
    p.add_argument("--out", required=True, type=Path, help="results JSON (refuses to overwrite)")
    a = p.parse_args()
    if min(a.n, a.clients, a.per_client) < 1:
        p.error("--n, --clients and --per-client must be at least 1")
    if a.out.exists():
        raise SystemExit(f"{a.out} exists; choose another --out")
    sentences = pick(Path(a.sentences).read_text(encoding="utf-8").splitlines(), a.words, a.n)
    if not sentences:
        raise SystemExit(f"{a.sentences} has no sentence to send")
    print(f"machine: {machine()}; {len(sentences)} sentences of "
          f"{min(len(s.split()) for s in sentences)}-{max(len(s.split()) for s in sentences)} "
          f"words", file=sys.stderr)

    server = argparse.Namespace(model=a.model, max_wait_ms=a.max_wait_ms, clients=[a.clients],
                                batch_tokens=a.batch_tokens, early_stop=a.early_stop,
                                precision=a.precision, threads=a.threads)
    fields = {} if a.beam_size is None else {"beam_size": a.beam_size}
    proc, port = start_server(server)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=a.timeout)
        for s in sentences[:4]:  # warm-up, both ways
            plain(conn, s, fields)
            streamed(conn, s, fields)
        conn.close()
        rows = one_at_a_time(port, sentences, fields, a.timeout)
        print(f"one at a time: {len(rows)} sentences", file=sys.stderr)
        levels, answers = [], []
        for stream in (True, False):
            level, results = concurrent(port, sentences, a.clients, a.per_client, stream, fields,
                                        a.timeout)
            levels.append(level)
            answers += [(stream, s, text) for s, _, text in results if text is not None]
            print(f"{a.clients} clients, {'streamed' if stream else 'plain':8s}: p50 "
                  f"{level['p50_s']} s, p99 {level['p99_s']} s, failed {level['failed']}",
                  file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    want = {r["sentence"]: r["plain_text"] for r in rows}
    failed_one = sum(r["plain_text"] is None or r["streamed_text"] is None for r in rows)
    differ_one = sum(r["plain_text"] != r["streamed_text"] for r in rows)
    differ_conc = {"streamed": 0, "plain": 0}
    for stream, s, text in answers:
        differ_conc["streamed" if stream else "plain"] += text != want[s]
    ratios = [r["first_words_s"] / r["plain_s"] for r in rows
              if r["plain_text"] is not None and r["streamed_text"] is not None]
    ok = [r for r in rows if r["plain_text"] is not None and r["streamed_text"] is not None]
    summary = {"median_plain_headers_s": median([r["plain_headers_s"] for r in ok]),
               "median_plain_s": median([r["plain_s"] for r in ok]),
               "median_first_words_s": median([r["first_words_s"] for r in ok]),
               "median_streamed_final_s": median([r["streamed_final_s"] for r in ok]),
               "median_first_words_over_plain": median(ratios),
               "first_words_came_with_final": sum(r["first_words_came_with_final"] for r in ok),
               "failed": failed_one, "streamed_differs_from_plain": differ_one}
    by = {lv["streamed"]: lv for lv in levels}
    results = {
        **stamp(), "model": a.model, "sentences_file": a.sentences, "words": a.words,
        "n": len(sentences), "word_counts": sorted(len(s.split()) for s in sentences),
        "beam_size": a.beam_size, "clients": a.clients, "per_client": a.per_client,
        "batch_tokens": a.batch_tokens,
        "max_wait_ms": a.max_wait_ms, "threads": a.threads, "early_stop": a.early_stop,
        "precision": a.precision,
        "one_at_a_time": summary,
        "concurrent": levels,
        "concurrent_differs_from_plain": differ_conc,
        "p99_streamed_over_plain": (round(by[True]["p99_s"] / by[False]["p99_s"], 3)
                                    if by[True]["p99_s"] and by[False]["p99_s"] else None),
        "streamed_equals_plain": differ_one == 0 and not any(differ_conc.values()),
        "rows": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                 for r in rows],
    }
    with atomic_write(a.out) as f:
        json.dump(results, f, indent=2, ensure_ascii=False)

    s = summary
    beam = "the model's beam" if a.beam_size is None else f"beam {a.beam_size}"
    print(f"\naiayn serve streaming on {machine()}: {len(sentences)} sentences of about "
          f"{a.words} words, {beam}\n")
    print("| one client at a time | median |")
    print("|---|---:|")
    print(f"| plain request, its headers | {show(s['median_plain_headers_s'])} |")
    print(f"| plain request, answer | {show(s['median_plain_s'])} |")
    print(f"| streamed, first words | {show(s['median_first_words_s'])} |")
    print(f"| streamed, final answer | {show(s['median_streamed_final_s'])} |")
    print(f"| first words / plain answer, per sentence | "
          f"{show(s['median_first_words_over_plain'], '', 2)} |")
    print(f"\n| {a.clients} concurrent clients, {a.per_client} requests each | p50 | p99 | failed |")
    print("|---|---:|---:|---:|")
    for lv in levels:
        print(f"| {'streamed' if lv['streamed'] else 'plain'} | {show(lv['p50_s'])} | "
              f"{show(lv['p99_s'])} | {lv['failed']} |")
    print(f"\nstreamed final == plain answer: {results['streamed_equals_plain']} (one at a time: "
          f"{differ_one} differ; concurrent: {differ_conc['streamed']} streamed, "
          f"{differ_conc['plain']} plain differ)")
    print(stamp_line(results))
    bad = failed_one + sum(lv["failed"] for lv in levels)
    return 0 if bad == 0 and results["streamed_equals_plain"] else 1


if __name__ == "__main__":
    sys.exit(main())
