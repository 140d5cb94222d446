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
    serve_client.py PORT accepted
        prints the completions accepted so far (the 200s of both endpoints in
        /metrics; the base of load and inflight)
    serve_client.py PORT load N HUGE BASE STAGGER OUT
        N requests (odd ones streamed, every third a chat), the first HUGE of
        2^20 tokens (they cannot end before a shutdown cancels them), the
        others of 300; all at once, or with STAGGER 1 each after the one before
        it was accepted (BASE + i in /metrics) and no request waits (a queue of
        1 takes them all); one line per request to OUT: "i status finish
        completion_tokens max_tokens shape" (shape "ok": a well-formed answer,
        a stream ending with its finish chunk and "data: [DONE]")
    serve_client.py PORT inflight BASE N
        waits (at most 300 s) until N requests were accepted since BASE and a
        sequence runs (moe_running_sequences > 0)
    serve_client.py - ended OUT N HUGE
        OUT (of load) after a shutdown: N answers, each 200 and well-formed,
        ended "length" at max_tokens or "cancelled" below it, the HUGE ones
        cancelled; prints "cancelled K" (K: the number cancelled)
    serve_client.py - curl DIR
        the answers of the curl commands DIR/*.cmd (README.md, docs/inference.md),
        each in DIR/*.out (and DIR/*.plain.out: the streamed ones asked again
        without streaming): their JSON fields, the streams' "data: [DONE]"
        end and their concatenation equal to the plain text
Prints "FAIL: ..." lines on stderr and exits 1 on a failed check.
"""
import glob
import http.client
import json
import os
import shlex
import socket
import sys
import threading
import time

PORT = int(sys.argv[1]) if sys.argv[1].isdigit() else 0
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL: " + msg, file=sys.stderr, flush=True)


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
    for body, words in (
            ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "'messages[0].name' must be a string"),
            ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3, "max_tokens": 2},
             "give one of 'max_completion_tokens' and 'max_tokens'"),
            ({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3},
             "give one of 'max_completion_tokens' and 'max_tokens'")):
        st, _, t = request("POST", "/v1/chat/completions", body)
        check(st == 400 and words in t, f"chat {body}: {st} {t}")
    # an error message longer than any fixed buffer (a key of 900 invalid bytes,
    # each escaped as \ufffd) is still one JSON object
    st, _, t = request("POST", "/v1/completions", raw=b'{"prompt": "a", "' + b"\xff" * 900 + b'": 1}')
    try:
        ok = st == 400 and "unrecognized key" in json.loads(t)["error"]["message"]
    except ValueError:
        ok = False
    check(ok, f"a long error message: {st} {t[:100]}...{t[-100:]}")
    # a body with another method: read and answered 405 / 404, the connection kept
    for method, path, code in (("PUT", "/v1/completions", 405), ("DELETE", "/health", 405),
                               ("PATCH", "/nope", 404)):
        try:
            st, _, t = request(method, path, {"prompt": "a"}, timeout=30)
            ok = st == code and "error" in json.loads(t)
        except (OSError, ValueError, http.client.HTTPException) as e:
            st, t, ok = -1, repr(e), False
        check(ok, f"{method} {path} with a body: {st} {t}")
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


def metrics():
    _, _, m = request("GET", "/metrics", timeout=30)
    return dict(l.rsplit(" ", 1) for l in m.splitlines() if l and l[0] != "#")


def accepted(m):
    return sum(int(m.get(f'moe_http_requests_total{{endpoint="{e}",code="200"}}', 0))
               for e in ("completions", "chat_completions"))


def wait_metrics(cond, what, limit=300):
    deadline = time.time() + limit
    while time.time() < deadline:
        if cond(metrics()):
            return True
        time.sleep(0.05)
    check(False, f"not within {limit} s: {what}")
    return False


HUGE_TOKENS = 1 << 20  # the largest max_tokens


def well_formed(chat, stream, st, ctype, text):
    """(finish_reason, completion_tokens) of an answer, or raises AssertionError."""
    assert st == 200, f"status {st}: {text[:200]}"
    if not stream:
        assert ctype.startswith("application/json"), ctype
        r = json.loads(text)
        assert r["object"] == ("chat.completion" if chat else "text_completion"), r["object"]
        ch = r["choices"][0]
        assert isinstance(ch["message"]["content"] if chat else ch["text"], str), ch
        u = r["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
        return ch["finish_reason"], u["completion_tokens"]
    assert ctype.startswith("text/event-stream"), ctype
    ev = sse_events(text)
    assert ev and ev[-1] == "[DONE]", f"the stream ends with {ev[-1:]}"
    chunks = [json.loads(e) for e in ev[:-1]]
    obj = "chat.completion.chunk" if chat else "text_completion"
    assert chunks and all(c["object"] == obj for c in chunks), "chunk objects"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]), "finish_reason before the end"
    last = chunks[-1]
    u = last["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    return last["choices"][0]["finish_reason"], u["completion_tokens"]


def load(n, huge, base, stagger, out):
    lines = {}
    lock = threading.Lock()

    def one(i):
        chat, stream = i % 3 == 2, i % 2 == 1
        mt = HUGE_TOKENS if i < huge else 300
        body = {"max_tokens": mt, "seed": i, "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": f"load {i}"}]
        else:
            body["prompt"] = f"load {i} "
        try:
            st, ctype, t = request("POST", "/v1/chat/completions" if chat else "/v1/completions", body,
                                   timeout=600)
            try:
                fin, toks = well_formed(chat, stream, st, ctype, t)
                line = f"{i} {st} {fin} {toks} {mt} ok"
            except (AssertionError, ValueError, KeyError, IndexError, TypeError) as e:
                line = f"{i} {st} - - {mt} bad:{str(e)[:80]!r}"
        except Exception as e:  # noqa: BLE001 (any failure is a test failure)
            line = f"{i} 0 - - {mt} {type(e).__name__}"
        with lock:
            lines[i] = line

    threads = []
    for i in range(n):
        if stagger and i > 0 and not wait_metrics(
                lambda m, i=i: accepted(m) >= base + i and int(m["moe_queue_length"]) == 0,
                f"request {i - 1} accepted and no request waiting"):
            break
        th = threading.Thread(target=one, args=(i,))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    open(out, "w").write("".join(lines[i] + "\n" for i in sorted(lines)))


def inflight(base, n):
    wait_metrics(lambda m: accepted(m) >= base + n and int(m["moe_running_sequences"]) > 0,
                 f"{n} requests accepted and running")


def ended(out, n, huge):
    rows = [l.split(" ", 5) for l in open(out).read().splitlines()]
    check(len(rows) == n, f"{len(rows)} answers of {n}: {rows}")
    cancelled = 0
    for i, st, fin, toks, mt, shape in rows:
        what = f"request {i}: {st} {fin} {toks} of {mt} {shape}"
        check(st == "200" and shape == "ok", what)
        if fin == "length":
            check(toks == mt and int(i) >= huge, what)
        else:
            check(fin == "cancelled" and toks.isdigit() and int(toks) < int(mt), what)
            cancelled += 1
    print(f"cancelled {cancelled}")


def curl(folder):
    """The answers of the docs' curl commands (see the module's help)."""
    cmds = sorted(glob.glob(os.path.join(folder, "*.cmd")))
    check(len(cmds) > 0, "no curl commands")
    for f in cmds:
        cmd = open(f).read().strip()
        out = open(f[:-4] + ".out", encoding="utf-8").read()
        argv = shlex.split(cmd)
        url = next(a for a in argv if a.startswith("localhost:"))
        path = url[url.index("/"):]
        body = json.loads(argv[argv.index("-d") + 1]) if "-d" in argv else None
        try:
            if path == "/health":
                assert json.loads(out) == {"status": "ok"}, out
            elif path == "/v1/models":
                m = json.loads(out)
                assert m["object"] == "list" and m["data"][0]["id"] == "tiny", m
            elif path == "/metrics":
                m = dict(l.rsplit(" ", 1) for l in out.splitlines() if l and l[0] != "#")
                assert int(m['moe_http_requests_total{endpoint="completions",code="200"}']) > 0, out[:300]
                assert "moe_running_sequences" in m and "moe_queue_length" in m, out[:300]
            else:
                chat = path == "/v1/chat/completions"
                assert chat or path == "/v1/completions", path
                stream = body.get("stream", False)
                mt = body.get("max_completion_tokens", body.get("max_tokens", 16))
                if not stream:
                    r = json.loads(out)
                    fin, toks = well_formed(chat, False, 200, "application/json", out)
                    assert r["model"] == "tiny" and r["id"].startswith("chatcmpl-" if chat else "cmpl-"), r
                    assert (fin, toks) == ("length", mt) or (fin == "stop" and toks <= mt), (fin, toks)
                    if chat:
                        assert r["choices"][0]["message"]["role"] == "assistant", r
                else:
                    fin, toks = well_formed(chat, True, 200, "text/event-stream", out)
                    chunks = [json.loads(e) for e in sse_events(out)[:-1]]
                    if chat:
                        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}, chunks[0]
                        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
                    else:
                        text = "".join(c["choices"][0]["text"] for c in chunks)
                    plain = json.loads(open(f[:-4] + ".plain.out", encoding="utf-8").read())
                    ch = plain["choices"][0]
                    want = ch["message"]["content"] if chat else ch["text"]
                    assert text == want, f"streamed {text!r} != plain {want!r}"
                    assert (fin, toks) == (ch["finish_reason"], plain["usage"]["completion_tokens"]), (fin, toks)
        except (AssertionError, ValueError, KeyError, IndexError, TypeError, StopIteration) as e:
            check(False, f"{cmd}: {type(e).__name__} {e}; answer {out[:300]!r}")


if __name__ == "__main__":
    what = sys.argv[2]
    if what == "api":
        api(sys.argv[3], sys.argv[4])
    elif what == "busy":
        busy()
    elif what == "accepted":
        print(accepted(metrics()))
    elif what == "load":
        load(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1", sys.argv[7])
    elif what == "inflight":
        inflight(int(sys.argv[3]), int(sys.argv[4]))
    elif what == "ended":
        ended(sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif what == "curl":
        curl(sys.argv[3])
    sys.exit(1 if fails else 0)
