#!/usr/bin/env python3
"""HTTP checks of `moe serve` for tests/serve_test.sh (standard library only).

    serve_client.py PORT api GENERATED.jsonl PROMPTS.jsonl
        the API: health, models, completions and chat (plain and streamed, the
        stream's concatenation equal to the plain text), the completions equal
        to `moe generate`'s lines for the same prompts (GENERATED.jsonl), 40
        requests at once, bad requests (400, 404, 405, 413), a client that
        disconnects mid-stream, metrics
    serve_client.py PORT busy
        a queue of 1 and 1 slot: some of 8 concurrent requests get 503
    serve_client.py PORT load N OUT
        N concurrent requests of 300 tokens; writes one line per finished
        response (status, finish_reason, tokens) to OUT (used across SIGTERM)
Prints "FAIL: ..." lines and exits 1 on a failed check.
"""
import http.client
import json
import socket
import sys
import threading

PORT = int(sys.argv[1])
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL: " + msg, flush=True)


def request(method, path, body=None, raw=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode("utf-8")
    c.close()
    return r.status, r.getheader("Content-Type") or "", text


def sse_events(text):
    out = []
    for block in text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        out.append(block[6:])
    return out


def stream(path, body):
    st, ctype, text = request("POST", path, dict(body, stream=True))
    check(st == 200 and ctype.startswith("text/event-stream"), f"stream {path}: {st} {ctype}")
    ev = sse_events(text)
    check(ev and ev[-1] == "[DONE]", f"stream {path} does not end with [DONE]: {ev[-1:]}")
    return [json.loads(e) for e in ev[:-1]]


def api(generated, prompts):
    st, _, t = request("GET", "/health")
    check(st == 200 and json.loads(t) == {"status": "ok"}, f"health: {st} {t}")
    st, _, t = request("GET", "/v1/models")
    m = json.loads(t)
    check(st == 200 and m["object"] == "list" and m["data"][0]["id"] == "tiny", f"models: {t}")

    # completions equal moe generate's lines (same prompts, seeds, parameters)
    gen = [json.loads(l) for l in open(generated)]
    reqs = [json.loads(l) for l in open(prompts) if l.strip()]
    for g, q in zip(gen, reqs):
        st, _, t = request("POST", "/v1/completions", q)
        r = json.loads(t)
        check(st == 200 and r["object"] == "text_completion", f"completion: {st} {t[:200]}")
        ch = r["choices"][0]
        check(ch["text"] == g["text"], f"prompt {g['index']}: served {ch['text']!r} vs generated {g['text']!r}")
        check(ch["finish_reason"] == g["finish_reason"], f"finish {ch['finish_reason']} vs {g['finish_reason']}")
        u = r["usage"]
        check(u["prompt_tokens"] == g["prompt_tokens"] and u["completion_tokens"] == g["completion_tokens"]
              and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"usage {u} vs {g}")

    # streaming: the concatenation equals the plain text for the same seed
    body = {"prompt": "the cat sat", "max_tokens": 40, "seed": 11, "temperature": 0.9}
    st, _, t = request("POST", "/v1/completions", body)
    plain = json.loads(t)["choices"][0]["text"]
    chunks = stream("/v1/completions", body)
    check(all(c["object"] == "text_completion" for c in chunks), "stream chunk objects")
    check("".join(c["choices"][0]["text"] for c in chunks) == plain, "completion stream != plain text")
    check(chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 40,
          f"last chunk: {chunks[-1]}")
    check(all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]), "finish_reason before the end")

    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the dog"}],
            "max_tokens": 30, "seed": 4, "stop": "."}
    st, _, t = request("POST", "/v1/chat/completions", chat)
    r = json.loads(t)
    check(st == 200 and r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant",
          f"chat: {st} {t[:200]}")
    content = r["choices"][0]["message"]["content"]
    check("." not in content, f"chat stop string in the content: {content!r}")
    check(r["usage"]["prompt_tokens"] == len("system: be brief\nuser: the dog\nassistant:"), f"chat usage {r['usage']}")
    chunks = stream("/v1/chat/completions", chat)
    check(chunks[0]["choices"][0]["delta"] == {"role": "assistant"}, f"chat stream opens with {chunks[0]}")
    check("".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == content,
          "chat stream != plain content")
    check(chunks[-1]["choices"][0]["finish_reason"] == r["choices"][0]["finish_reason"], "chat stream finish")

    # 40 at once: every answer equals the one asked alone
    want = {}
    for i in range(40):
        b = {"prompt": f"dog {i} ", "max_tokens": 20 + i % 7, "seed": i, "temperature": 0.8}
        want[i] = (b, None)
    results = {}

    def one(i):
        try:
            st, _, t = request("POST", "/v1/completions", want[i][0])
            results[i] = (st, json.loads(t)["choices"][0]["text"] if st == 200 else t)
        except Exception as e:  # noqa: BLE001 (any failure is a test failure)
            results[i] = (0, str(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in (0, 13, 39):
        st, _, t = request("POST", "/v1/completions", want[i][0])
        check(results[i] == (200, json.loads(t)["choices"][0]["text"]), f"concurrent request {i}: {results[i]}")
    check(all(results[i][0] == 200 for i in range(40)), f"concurrent statuses {[results[i][0] for i in range(40)]}")

    # bad requests
    for raw, code, words in [
        (b"{not json", 400, "request"),
        (b'{"max_tokens": 3}', 400, "'prompt' is required"),
        (b'{"prompt": "a", "max_tokens": 2000000}', 400, "max_tokens"),
        (b'{"prompt": "a", "temperature": "hot"}', 400, "temperature"),
        (b'{"prompt": "a", "frequency_penalty": 1}', 400, "unrecognized key 'frequency_penalty'"),
        (b'{"prompt": "a", "n": 3}', 400, "'n' must be 1"),
        (b"", 400, "request"),
        (b'{"prompt": "' + b"x" * 5000 + b'"}', 413, "larger than 4096 bytes"),
    ]:
        st, ctype, t = request("POST", "/v1/completions", raw=raw)
        ok = st == code and ctype.startswith("application/json")
        try:
            e = json.loads(t)["error"]
            ok = ok and words in e["message"] and "type" in e
        except (ValueError, KeyError):
            ok = False
        check(ok, f"bad request {raw[:40]!r}: {st} {t[:200]}")
    st, _, t = request("POST", "/v1/chat/completions", {"prompt": "a"})
    check(st == 400 and "'prompt'" in t, f"chat with prompt: {st} {t}")
    st, _, t = request("GET", "/v1/completions")
    check(st == 405 and "POST" in t, f"GET completions: {st} {t}")
    st, _, t = request("GET", "/v2/nothing")
    check(st == 404, f"unknown path: {st}")

    # a client that disconnects mid-stream: the server cancels it and goes on
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    body = json.dumps({"prompt": "away", "max_tokens": 100000, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    st, _, t = request("POST", "/v1/completions", {"prompt": "still here", "max_tokens": 5})
    check(st == 200 and json.loads(t)["usage"]["completion_tokens"] == 5, f"after a disconnect: {st} {t}")
    import time
    deadline = time.time() + 30
    cancelled = 0
    while time.time() < deadline:
        _, _, m = request("GET", "/metrics")
        for line in m.splitlines():
            if line.startswith('moe_requests_finished_total{reason="cancelled"}'):
                cancelled = int(line.split()[-1])
        if cancelled >= 1:
            break
        time.sleep(0.2)
    check(cancelled >= 1, "the disconnected stream was not cancelled")
    for name in ["moe_http_requests_total{endpoint=\"completions\",code=\"200\"}",
                 "moe_http_requests_total{endpoint=\"completions\",code=\"413\"}",
                 "moe_request_duration_seconds_bucket{le=\"+Inf\"}", "moe_time_to_first_token_seconds_count",
                 "moe_queue_length", "moe_running_sequences", "moe_completion_tokens_total"]:
        check(name in m, f"metrics lack {name}")


def busy():
    res = []

    def one(i):
        st, _, t = request("POST", "/v1/completions", {"prompt": f"{i}", "max_tokens": 200})
        res.append((st, t))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    codes = sorted(st for st, _ in res)
    check(codes.count(503) >= 1 and codes.count(200) >= 2, f"queue of 1: statuses {codes}")
    for st, t in res:
        if st == 503:
            check("queue is full" in json.loads(t)["error"]["message"], f"503 body: {t}")


def load(n, out):
    lines = []
    lock = threading.Lock()

    def one(i):
        try:
            st, _, t = request("POST", "/v1/completions", {"prompt": f"load {i}", "max_tokens": 300})
            r = json.loads(t)
            line = f"{st} {r['choices'][0]['finish_reason']} {r['usage']['completion_tokens']}" if st == 200 else f"{st} error"
        except Exception as e:  # noqa: BLE001
            line = f"0 {type(e).__name__}"
        with lock:
            lines.append(line)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    open(out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    what = sys.argv[2]
    if what == "api":
        api(sys.argv[3], sys.argv[4])
    elif what == "busy":
        busy()
    elif what == "load":
        load(int(sys.argv[3]), sys.argv[4])
    sys.exit(1 if fails else 0)
