"""`aiayn serve` under bounded load on loopback: throughput, latency and the batching gain.

Starts `aiayn serve` on 127.0.0.1 (a free port), then for each concurrency level runs that many
clients, each sending a fixed number of sentences one request at a time (closed loop, keep-alive
connections), and stops by itself. Per level: sentences/s, p50 and p99 latency, failed requests
and the server's mean batch size (from its /metrics). The batching gain is the throughput at 32
clients divided by the throughput of one client at a time, both measured in the same run. Every
answer is compared with `aiayn translate` on the same sentences (same model, same defaults).

    .venv/bin/python benchmarks/bench_serve.py --model runs/m30k/model \\
        --sentences runs/m30k/data/test.src.txt --clients 1 8 32 64 --per-client 16

Loopback only: the server binds 127.0.0.1 and the clients connect there. Run it alone on the
machine: the clients share the CPU with the server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiayn.decoding import DECODE_PRECISIONS, EARLY_STOP_RULES  # noqa: E402
from aiayn.files import atomic_write  # noqa: E402

from provenance import cpu_name, stamp  # noqa: E402


def machine() -> str:
    """The CPU's model name and core count, for the report."""
    return f"{cpu_name()}, {os.cpu_count()} cores"


def add_server_arguments(p: argparse.ArgumentParser, reference: bool = True) -> None:
    """The server's options, for this script and stream_latency.py (`reference`: the
    `aiayn translate` reference shares the stopping rule and arithmetic)."""
    also = "the server's and the reference's" if reference else "the server's"
    p.add_argument("--batch-tokens", type=int, help="server's room (default: aiayn serve's)")
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="server's max wait (default 10)")
    p.add_argument("--threads", type=int, help="server's torch threads (default: aiayn serve's)")
    p.add_argument("--early-stop", choices=EARLY_STOP_RULES,
                   help=f"{also} stopping rule (default: aiayn's)")
    p.add_argument("--precision", choices=DECODE_PRECISIONS,
                   help=f"{also} arithmetic (default: aiayn's)")
    p.add_argument("--timeout", type=float, default=120.0, help="client timeout per request, seconds")


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "aiayn", "serve", "--model", args.model, "--host", "127.0.0.1",
           "--port", "0", "--max-wait-ms", str(args.max_wait_ms),
           "--max-queue", str(max(1024, 4 * max(args.clients)))]
    if args.batch_tokens:
        cmd += ["--batch-tokens", str(args.batch_tokens)]
    if args.early_stop:
        cmd += ["--early-stop", args.early_stop]
    if args.precision:
        cmd += ["--precision", args.precision]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(raw.decode("utf-8", "replace")) for raw in proc.stderr]
                     + [lines.put("")], daemon=True).start()
    while True:
        line = lines.get(timeout=300)
        if not line:
            raise SystemExit(f"aiayn serve did not start (exit {proc.wait()})")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
        if m:
            return proc, int(m.group(1))


def request(conn: http.client.HTTPConnection, path: str, body: dict | None = None) -> tuple[int, dict | str]:
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read().decode("utf-8")
    return r.status, (json.loads(data) if r.getheader("content-type", "").startswith("application/json") else data)


def batch_totals(port: int) -> tuple[float, float]:
    """(batches, sentences) the server has searched so far."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    _, text = request(conn, "/metrics")
    conn.close()
    count = float(re.search(r"^aiayn_batch_sentences_count (\S+)$", text, re.M).group(1))
    total = float(re.search(r"^aiayn_batch_sentences_sum (\S+)$", text, re.M).group(1))
    return count, total


def client(port: int, sentences: list[str], results: list, timeout: float) -> None:
    """Send each sentence in turn; append (sentence, status, seconds, translation) to results."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    for s in sentences:
        start = time.perf_counter()
        try:
            status, body = request(conn, "/translate", {"q": s})
            text = body.get("translatedText") if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError):
            status, text = -1, None
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        results.append((s, status, time.perf_counter() - start, text))
    conn.close()


def closed_loop(n_clients: int, per_client: int, pool: list[str],
                run: Callable[[list[str], list], None]) -> tuple[list, float]:
    """`n_clients` threads at once, each `run(its sentences, results)` over `per_client` of
    `pool` (taken in turn): everything the clients appended to `results`, and the wall seconds
    (this script's and stream_latency.py's load)."""
    work = [[pool[(i * per_client + j) % len(pool)] for j in range(per_client)]
            for i in range(n_clients)]
    results: list = []
    threads = [threading.Thread(target=run, args=(w, results)) for w in work]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - start


def run_level(port: int, n_clients: int, per_client: int, pool: list[str], timeout: float) -> dict:
    batches0, sents0 = batch_totals(port)
    results, wall = closed_loop(n_clients, per_client, pool,
                                lambda w, out: client(port, w, out, timeout))
    batches1, sents1 = batch_totals(port)
    ok = [r for r in results if r[1] == 200]
    lat = sorted(r[2] for r in ok)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    return {"clients": n_clients, "requests": len(results), "failed": len(results) - len(ok),
            "seconds": round(wall, 3), "sentences_per_s": round(len(ok) / wall, 2),
            "p50_s": round(q[49], 4), "p99_s": round(q[98], 4),
            "mean_batch": round((sents1 - sents0) / max(batches1 - batches0, 1), 2),
            "answers": {s: t for s, _, _, t in ok}}


def reference(args: argparse.Namespace, sentences: list[str]) -> dict[str, str]:
    """`aiayn translate` on the same sentences: sentence -> translation."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "src.txt"
        src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        cmd = [sys.executable, "-m", "aiayn", "translate", "--model", args.model, "--input", str(src)]
        if args.early_stop:
            cmd += ["--early-stop", args.early_stop]
        if args.precision:
            cmd += ["--precision", args.precision]
        out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                             capture_output=True, check=True, timeout=3600).stdout.decode("utf-8")
    return dict(zip(sentences, out.split("\n")[:-1]))


def plot(results: dict, path: str) -> None:
    """Two panels against concurrent clients: sentences/s, and p50/p99 latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = results["levels"]
    clients = [lv["clients"] for lv in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(clients, [lv["sentences_per_s"] for lv in levels], "o-", color="#2f5fd0")
    a.set(xscale="log", xlabel="concurrent clients", ylabel="sentences / s",
          title="throughput (one sentence per request)")
    b.plot(clients, [lv["p50_s"] for lv in levels], "o-", label="p50")
    b.plot(clients, [lv["p99_s"] for lv in levels], "s--", label="p99")
    b.set(xscale="log", xlabel="concurrent clients", ylabel="seconds", title="latency per request")
    b.legend()
    for ax in (a, b):
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.grid(alpha=0.3)
    fig.suptitle(f"aiayn serve on {results['machine']}", fontsize=10)
    fig.tight_layout()
    with atomic_write(path, "wb", encoding=None) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (required unless --from-json)")
    p.add_argument("--sentences", help="source sentences, one a line (e.g. Multi30k test)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64], help="concurrency levels")
    p.add_argument("--per-client", type=int, default=16, help="sentences each client sends (default 16)")
    add_server_arguments(p)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--plot", help="draw sentences/s and latency against clients here (PNG)")
    p.add_argument("--from-json", metavar="FILE", help="only draw --plot from an earlier --out")
    args = p.parse_args()
    if args.from_json:
        if not args.plot:
            p.error("--from-json needs --plot")
        plot(json.loads(Path(args.from_json).read_text()), args.plot)
        return 0
    if not (args.model and args.sentences):
        p.error("--model and --sentences are required")

    pool = [s for s in Path(args.sentences).read_text(encoding="utf-8").splitlines() if s.strip()]
    used = sorted({pool[k % len(pool)] for k in range(max(args.clients) * args.per_client)})
    print(f"machine: {machine()}; {len(pool)} sentences in {args.sentences}", file=sys.stderr)
    print("reference: aiayn translate ...", file=sys.stderr)
    want = reference(args, used)
    proc, port = start_server(args)
    levels = []
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for s in pool[:4]:  # warm-up
            request(conn, "/translate", {"q": s})
        conn.close()
        for n in args.clients:
            level = run_level(port, n, args.per_client, pool, args.timeout)
            answers = level.pop("answers")
            level["differ_from_translate"] = sum(answers[s] != want[s] for s in answers)
            levels.append(level)
            print(f"{n:3d} clients: {level['sentences_per_s']:7.1f} sent/s  p50 {level['p50_s']:.3f} s  "
                  f"p99 {level['p99_s']:.3f} s  failed {level['failed']}  mean batch "
                  f"{level['mean_batch']}  differ {level['differ_from_translate']}", file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    by = {lv["clients"]: lv for lv in levels}
    gain = by[32]["sentences_per_s"] / by[1]["sentences_per_s"] if 1 in by and 32 in by else None
    print(f"\naiayn serve on {machine()}; {args.per_client} Multi30k sentences per client, one per "
          f"request\n")
    print("| clients | requests | sentences/s | p50 latency | p99 latency | failed | mean batch | differ from translate |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for lv in levels:
        print(f"| {lv['clients']} | {lv['requests']} | {lv['sentences_per_s']:.1f} | {lv['p50_s']:.3f} s "
              f"| {lv['p99_s']:.3f} s | {lv['failed']} | {lv['mean_batch']} | {lv['differ_from_translate']} |")
    if gain is not None:
        print(f"\nbatching gain (32 clients / 1 client): {gain:.1f}x")
    results = {**stamp(), "machine": machine(), "model": args.model, "per_client": args.per_client,
               "batch_tokens": args.batch_tokens, "max_wait_ms": args.max_wait_ms,
               "threads": args.threads, "early_stop": args.early_stop, "precision": args.precision,
               "levels": levels, "batching_gain_32": gain}
    if args.out:
        with atomic_write(args.out, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        plot(results, args.plot)
    failed = sum(lv["failed"] for lv in levels)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
