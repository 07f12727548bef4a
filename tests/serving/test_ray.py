"""`python -m halformer.serve.ray` (Ray Serve) against plain HTTP clients: 2 replicas each of
reverse-tiny (generate) and all-MiniLM-L6-v2 (embed_text), 1 of MiniLM pooled. Results equal
the Python API bit for bit, concurrent requests are batched and spread over both replicas,
bad requests get 400 naming the problem, a killed replica loses no retried request, and
SIGTERM drains and exits 0 leaving no Ray process behind.

One server for the whole file (Ray starts slowly on 2 cores), in its own session, with
RAY_TMPDIR a fresh short temp dir (Ray's socket paths must stay under 108 bytes) that
holds everything Ray writes; usage stats off."""
import collections
import concurrent.futures as cf
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from conftest import RayServer, write_config

SOURCES = [[3, 7, 1, 9], [5, 4, 3], [1, 2, 3, 4, 5, 6, 7, 8], [13], [2] * 12]
GEN_OPTIONS = [{}, {"max_new_tokens": 3}, {"sampling_topk": 0, "sampling_temperature": 0.8, "seed": 7},
               {"beam_size": 3}]
TEXTS = ["A man is eating food.", "Someone is eating a meal.", "The stock market fell.", "héllo wörld ☃",
         " ".join(["word"] * 600)]  # truncated at max_seq_length (256 tokens), as the API does
ID_ROWS = [[101, 7592, 2088, 102], [101, 1037, 2158, 2003, 5983, 2833, 1012, 102], [101, 102]]


def run_cli(args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_TMPDIR=cwd, RAY_USAGE_STATS_ENABLED="0")
    p = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def test_config_errors_before_ray_starts(tmp_path):
    """Exit 2 and one line naming the problem; Triton's server refuses Ray's `replicas` key,
    Ray Triton's `instances`."""
    good = write_config(str(tmp_path / "good.yaml"), replicas={"reverse": 2})
    bad = write_config(str(tmp_path / "bad.yaml"), replicas={"minilm": 0})
    instances = str(tmp_path / "instances.yaml")
    with open(instances, "w") as f:
        f.write(open(write_config(str(tmp_path / "base.yaml"))).read().replace("    threads:", "    instances: 2\n    threads:", 1))
    cases = [(["halformer.serve.ray", bad], "model 'minilm': replicas 0 is outside [1, 1024]"),
             (["halformer.serve.ray", good, "--replicas", "0"], "--replicas 0 is outside [1, 1024]"),
             (["halformer.serve.ray", good, "--port", "70000"], "--port 70000 is outside [1, 65535]"),
             (["halformer.serve", good, "--check"], "replicas is for python -m halformer.serve.ray"),
             (["halformer.serve.ray", instances, "--check"], "instances is for python -m halformer.serve (Triton)")]
    for args, words in cases:
        code, out = run_cli(args, str(tmp_path))
        assert code == 2 and words in out, (args, code, out)
    code, out = run_cli(["halformer.serve.ray", good, "--check"], str(tmp_path))
    code, out = run_cli(["halformer.serve.ray", write_config(str(tmp_path / "stream.yaml"), stream=True), "--check"],
                        str(tmp_path))
    assert code == 0 and "ok (4 models)" in out, out  # generate_stream too
    code, out = run_cli(["halformer.serve.ray", good, "--check"], str(tmp_path))
    assert code == 0 and "ok (3 models)" in out, out
    assert not os.path.exists(tmp_path / "ray"), "Ray started for a configuration check"
    print(f"\n{len(cases)} bad configurations: exit 2 naming the problem; --check ok")


@pytest.fixture(scope="module")
def server():
    s = RayServer()
    try:
        s.wait_ready()
        yield s
    finally:
        s.kill()


def call(server, model, body=None, method="POST", raw=None, timeout=120):
    """-> (status, JSON body, headers); body is JSON-encoded unless raw bytes are given."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    if data is not None and len(data) > (1 << 20):
        # An oversized body: the server answers 413 from Content-Length without reading it
        # and closes, so a client still sending may get a broken pipe instead of the answer
        # (seen under load). Send the headers alone and read the answer.
        host, port = server.url.split("//")[1].split("/")[0].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            conn.putrequest(method, f"/{model}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(data)))
            conn.endheaders()
            r = conn.getresponse()
            text = r.read().decode("utf-8", "replace")
            try:
                return r.status, json.loads(text), r.headers
            except ValueError:
                return r.status, {"error": text}, r.headers
        finally:
            conn.close()
    req = urllib.request.Request(f"{server.url}/{model}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8", "replace")
        try:
            return e.code, json.loads(text), e.headers
        except ValueError:
            return e.code, {"error": text}, e.headers


def expected(api):
    """(model, request body, expected output) for every case, from the Python API."""
    cases = []
    for src in SOURCES:
        for opts in GEN_OPTIONS:
            cases.append(("reverse", {"input_ids": src, **opts}, want_generate(api, src, **opts)))
    for t in TEXTS:
        cases.append(("minilm", {"text": t}, api["embed"].encode([t], convert_to_numpy=True)[0]))
    for row in ID_ROWS:
        cases.append(("minilm_pooled", {"input_ids": row}, api["pooled"].pooled([row])[0]))
    return cases


def want_generate(api, src, **opts):
    """(tokens, scores) the Python API gives: per-token log-probabilities, or a beam's score."""
    d = api["reverse"].generate([src], return_scores=True, **opts)[0]
    return d["tokens"], d.get("log_probs", [d.get("score")])


def check(model, status, body, want):
    assert status == 200, (model, status, body)
    if model == "reverse":
        tokens, scores = want
        assert body["output_ids"] == list(tokens)
        assert np.asarray(body["scores"], np.float32).tolist() == np.asarray(scores, np.float32).tolist()
    else:
        got = np.asarray(body["embedding" if model == "minilm" else "output"], dtype=np.float32)
        assert got.shape == want.shape and got.tobytes() == np.asarray(want, np.float32).tobytes()


def test_results_equal_python_api(server, api):
    cases = expected(api)
    for model, body, want in cases:
        status, out, _ = call(server, model, body)
        check(model, status, out, want)
    # "scores": false: the same tokens, no scores (greedy keeps its argmax kernel)
    for opts in ({}, {"beam_size": 2}):
        status, out, _ = call(server, "reverse", {"input_ids": [3, 7, 1, 9], "scores": False, **opts})
        assert status == 200 and out == {"output_ids": want_generate(api, [3, 7, 1, 9], **opts)[0]}, (opts, out)
    status, info, _ = call(server, "reverse", method="GET")
    assert status == 200 and info["kind"] == "generate" and info["vocab"] == 16 and info["max_batch_size"] == 8
    print(f"{len(cases)} requests one at a time: equal to the Python API")


def sse(server, model, body, scores=None):
    """POST a generate_stream request: (status, tokens, error messages) from its events, or
    from the JSON error of a request refused before its first token. `scores`: a list that
    gets the events' "score" values."""
    req = urllib.request.Request(f"{server.url}/{model}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.headers["content-type"].startswith("text/event-stream"), r.headers
            events = [json.loads(line[len(b"data: "):]) for line in r if line.startswith(b"data: ")]
            if scores is not None:
                scores += [e["score"] for e in events if "score" in e]
            return r.status, [e["output_id"] for e in events if "output_id" in e], [e["error"] for e in events
                                                                                   if "error" in e]
    except urllib.error.HTTPError as e:
        return e.code, [], [json.loads(e.read())["error"]]


def test_generate_stream_equals_python_api(server, api):
    """generate_stream on Ray: one server-sent event per new token, together generate's
    tokens (greedy and sampling); a refused request is HTTP 400 naming the problem."""
    n = 0
    for src in SOURCES:
        for opts in GEN_OPTIONS[:3]:
            scores = []
            status, tokens, errors = sse(server, "reverse_stream", {"input_ids": src, **opts}, scores)
            want = api["reverse"].generate([src], return_scores=True, **opts)[0]
            assert status == 200 and not errors and tokens == want["tokens"], (src, opts, status, tokens, errors)
            assert scores == np.asarray(want["log_probs"], np.float32).tolist(), (src, opts, scores)
            # "scores": false: the same tokens, events without scores
            scores = []
            status, tokens, _ = sse(server, "reverse_stream", {"input_ids": src, "scores": False, **opts}, scores)
            assert status == 200 and tokens == want["tokens"] and scores == [], (src, opts, scores)
            n += 1
    bad = [({"input_ids": [3, 7, 16]}, "input_ids[0][2] = 16"), ({"input_ids": [3, 7], "beam_size": 2}, "beam_size"),
           ({"input_ids": [3, 7], "scores": "no"}, '"scores" must be true or false'),
           ({"input_ids": [3, 7], "score": True}, "unknown key(s) ['score']"),
           ({"input_ids": [3, 7], "max_new_tokens": 1000}, "max_new_tokens 1000")]
    for body, fragment in bad:
        status, tokens, errors = sse(server, "reverse_stream", body)
        assert status == 400 and not tokens and len(errors) == 1 and fragment in errors[0], (body, status, errors)
        assert sse(server, "reverse_stream", {"input_ids": [3, 7, 1, 9]})[1] == [9, 1, 7, 3, 15]
    print(f"{n} streams equal to the Python API; {len(bad)} bad ones refused with 400")


def test_concurrent_requests_are_batched_over_both_replicas(server, api):
    cases = expected(api) * 4  # 92 requests, 16 threads
    batches, replicas = collections.defaultdict(collections.Counter), collections.defaultdict(set)

    def one(case):
        model, body, want = case
        status, out, headers = call(server, model, body)
        check(model, status, out, want)
        return model, int(headers["x-halformer-batch-size"]), headers["x-halformer-replica"]

    with cf.ThreadPoolExecutor(16) as ex:
        for model, n, pid in ex.map(one, cases):
            batches[model][n] += 1
            replicas[model].add(pid)
    print(f"{len(cases)} requests from 16 threads: batch sizes seen "
          f"{ {m: dict(sorted(c.items())) for m, c in batches.items()} }, replicas {dict(replicas)}")
    for model in ("reverse", "minilm"):
        assert max(batches[model]) > 1, (model, batches[model])
        assert len(replicas[model]) == 2, (model, replicas[model])


BAD = [  # (model, method, raw body, status, words the error must contain)
    ("reverse", "POST", b'{"input_ids": [3, 7', 400, "not valid JSON"),
    ("reverse", "POST", b"[3, 7, 1]", 400, "must be a JSON object"),
    ("reverse", "POST", b"{}", 400, 'missing "input_ids"'),
    ("reverse", "POST", b'{"input_ids": "3 7 1"}', 400, "flat list of integer token ids"),
    ("reverse", "POST", b'{"input_ids": [3, 1.5]}', 400, "flat list of integer token ids"),
    ("reverse", "POST", b'{"input_ids": [3, true]}', 400, "flat list of integer token ids"),
    ("reverse", "POST", b'{"input_ids": [[3, 7]]}', 400, "flat list of integer token ids"),
    ("reverse", "POST", b'{"input_ids": []}', 400, "input_ids is empty"),
    ("reverse", "POST", b'{"input_ids": [3, 16]}', 400, "= 16 is outside the vocabulary [0, 16)"),
    ("reverse", "POST", b'{"input_ids": [-1]}', 400, "= -1 is outside the vocabulary"),
    ("reverse", "POST", b'{"input_ids": [99999999999999999999999]}', 400, "is outside the vocabulary"),
    ("reverse", "POST", json.dumps({"input_ids": [3] * 65}).encode(), 400, "65 tokens, more than the model's max_len 64"),
    ("reverse", "POST", b'{"input_ids": [3], "num_beams": 2}', 400, "unknown key(s) ['num_beams']"),
    ("reverse", "POST", b'{"input_ids": [3], "beam_size": 2, "sampling_topk": 5}', 400, "beam search takes"),
    ("reverse", "POST", b'{"input_ids": [3], "max_new_tokens": 0}', 400, "max_new_tokens 0 is outside"),
    ("reverse", "POST", b'{"input_ids": [3], "max_new_tokens": "many"}', 400, "max_new_tokens must be an integer"),
    ("reverse", "POST", b'{"input_ids": [3], "sampling_temperature": "hot"}', 400, "sampling_temperature must be a number"),
    ("reverse", "POST", b'{"input_ids": [3], "scores": "no"}', 400, '"scores" must be true or false'),
    ("reverse", "PUT", b'{"input_ids": [3]}', 405, "method PUT"),
    ("minilm", "POST", b'{"text": 5}', 400, '"text" must be a string'),
    ("minilm", "POST", b'{"texts": ["a"]}', 400, "unknown key(s) ['texts']"),
    ("minilm", "POST", json.dumps({"text": "x" * 5000}).encode(), 400, "5000 bytes, more than max_text_bytes 4096"),
    ("minilm", "POST", b'{"text": "\\ud800"}', 400, "not valid UTF-8"),
    ("minilm", "POST", b"\xff\xfe", 400, "not valid JSON"),
    ("minilm", "POST", b"1" * (3 << 20), 413, "over the limit"),
    ("minilm_pooled", "POST", b'{"input_ids": [30522]}', 400, "= 30522 is outside the vocabulary [0, 30522)"),
    ("nosuch", "POST", b"{}", 404, "not found"),
]


def test_bad_requests_get_errors_and_the_server_keeps_serving(server, api):
    src = SOURCES[0]
    good = want_generate(api, src)
    for model, method, raw, status, words in BAD:
        code, body, _ = call(server, model, method=method, raw=raw)
        assert code == status and words in body["error"], (model, raw[:60], code, body)
        code, body, _ = call(server, "reverse", {"input_ids": src})
        check("reverse", code, body, good)
    # bad and good requests in the same batches: only the bad ones fail
    reqs = [{"input_ids": [3, 16 if k % 4 == 0 else k % 16]} for k in range(16)]
    with cf.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(lambda b: call(server, "reverse", b), reqs))
    sizes = [int(h["x-halformer-batch-size"]) for _, _, h in results]
    for body, (code, out, _) in zip(reqs, results):
        if 16 in body["input_ids"]:
            assert code == 400 and "outside the vocabulary" in out["error"]
        else:
            check("reverse", code, out, want_generate(api, body["input_ids"]))
    assert max(sizes) > 1, sizes
    # clients that hang up: mid-body, and after sending a long request without reading the answer
    body = json.dumps({"text": " ".join(["serving"] * 300)}).encode()
    head = f"POST /minilm HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    for cut in (len(body) // 2, len(body), len(body)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head.encode() + body[:cut])
        code, out, _ = call(server, "reverse", {"input_ids": src})
        check("reverse", code, out, good)
    print(f"{len(BAD)} bad requests: each its error, a good request after each answered; "
          f"16 mixed at once (4 bad, batch sizes {sorted(collections.Counter(sizes).items())}): only the 4 failed; "
          f"3 clients hanging up mid-request: still serving")


def test_killed_replica_loses_no_retried_request(server, api):
    """Ray Serve answers the requests that were on a killed replica with HTTP 500; a client
    that retries gets its answer from the other replica; the controller starts a new one."""
    text = TEXTS[0]
    want = api["embed"].encode([text], convert_to_numpy=True)[0]
    _, _, h = call(server, "minilm", {"text": text})
    victim = int(h["x-halformer-replica"])
    n, stop_at, answered, retries, failures = 200, time.monotonic() + 90, {}, collections.Counter(), []
    lock, samples = threading.Lock(), {}

    def client(k):
        while time.monotonic() < stop_at:
            try:
                code, out, _ = call(server, "minilm", {"text": text}, timeout=60)
            except OSError as e:  # connection reset while the replica died
                code, out = 0, {"error": str(e)}
            if code == 200:
                check("minilm", code, out, want)
                with lock:
                    answered[k] = answered.get(k, 0) + 1
                return
            with lock:
                retries[code] += 1
                samples.setdefault(code, str(out.get("error", out))[:120])
            time.sleep(0.2)
        failures.append(k)

    with cf.ThreadPoolExecutor(8) as ex:
        futures = [ex.submit(client, k) for k in range(n)]
        while sum(f.done() for f in futures) < n // 4:
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        for f in futures:
            f.result()
    assert not failures and sorted(answered) == list(range(n)) and set(answered.values()) == {1}
    # the controller replaces the replica: two live replicas again, the victim not among them
    seen, end = set(), time.monotonic() + 90
    while len(seen) < 2 and time.monotonic() < end:
        with cf.ThreadPoolExecutor(8) as ex:
            seen |= {h["x-halformer-replica"] for _, _, h in ex.map(lambda _: call(server, "minilm", {"text": text}),
                                                                    range(16))}
        time.sleep(0.5)
    print(f"replica {victim} killed after {n // 4} of {n} requests: all {n} answered once; "
          f"retries by status {dict(retries)} {samples}; replicas answering {time.monotonic() - killed:.1f} s "
          f"later {sorted(seen)}")
    assert str(victim) not in seen and len(seen) == 2, seen


def test_sigterm_drains_and_leaves_nothing(server, api):
    assert server.processes(), "no Ray process found in the server's session"
    text = " ".join(["serving"] * 300)  # 256 tokens: each request takes a while
    n = 24
    results, sent = {}, threading.Barrier(n + 1)
    body = json.dumps({"text": text}).encode()

    def client(k):  # SIGTERM only once every request is on the wire (in flight, not still to come)
        conn = http.client.HTTPConnection(urllib.parse.urlparse(server.url).netloc, timeout=120)
        try:
            conn.request("POST", "/minilm", body=body, headers={"Content-Type": "application/json"})
        finally:
            sent.wait()
        r = conn.getresponse()
        r.read()
        results[k] = r.status

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    sent.wait()
    time.sleep(0.5)  # the proxy has read them (a request it reads after the route is gone is a 404)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout=60)
    took = time.monotonic() - t0
    for t in threads:
        t.join(timeout=60)
    left, end = server.processes(), time.monotonic() + 30
    while left and time.monotonic() < end:
        time.sleep(0.5)
        left = server.processes()
    print(f"SIGTERM with {n} requests in flight: exit {code} after {took:.1f} s; "
          f"requests answered {sorted(collections.Counter(results.values()).items())}; Ray processes left {left}")
    assert code == 0, server.tail()
    assert "halformer.serve.ray: stopped" in server.tail()
    assert took < 45
    assert sorted(results) == list(range(n)) and set(results.values()) == {200}, results
    assert not left
    assert os.path.isdir(os.path.join(server.tmp, "ray")), "Ray did not use RAY_TMPDIR"
