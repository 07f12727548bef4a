"""tritonclient HTTP and gRPC against a real `python -m halformer.serve`: every kind equals
the Python API bit for bit; concurrent clients are batched (Triton's statistics) with
results unchanged; bad requests get errors naming the problem and the server keeps serving."""
import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException


SOURCES = [[3, 7, 1, 9], [5, 4, 3], [1, 2, 3, 4, 5, 6, 7, 8], [13], [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]]
GEN_OPTIONS = [{}, {"max_new_tokens": 3}, {"sampling_topk": 0, "sampling_temperature": 0.8, "seed": 7},
               {"beam_size": 3}, {"beam_size": 2, "length_penalty": 0.6, "max_new_tokens": 4}]
TEXTS = ["A man is eating food.", "Someone is eating a meal.", "The stock market fell.", "héllo wörld ☃",
         " ".join(["word"] * 600)]  # 600 words: truncated at max_seq_length (256 tokens), as the API does
ID_ROWS = [[101, 7592, 2088, 102], [101, 1037, 2158, 2003, 5983, 2833, 1012, 102], [101, 102]]


@pytest.fixture(scope="module")
def server(server_factory):
    # a 20 ms queue delay makes the batching test's batches certain on a loaded machine
    return server_factory(delay_us=20000, max_batch=16, stream=True)


_open = {}


def clients(server):
    """One HTTP and one gRPC client per server, closed before the server stops (open
    connections would hold up Triton's shutdown)."""
    if id(server) not in _open:
        _open[id(server)] = [("http", th, th.InferenceServerClient(server.http)),
                             ("grpc", tg, tg.InferenceServerClient(server.grpc))]
    return _open[id(server)]


@pytest.fixture(scope="module", autouse=True)
def close_clients(server):
    yield
    for _, _, c in _open.pop(id(server), []):
        c.close()


def ids_input(mod, ids, name="INPUT_IDS", dtype=np.int32, triton_type="INT32"):
    a = np.asarray(ids, dtype=dtype)
    if a.ndim == 1:
        a = a[None, :]
    i = mod.InferInput(name, list(a.shape), triton_type)
    i.set_data_from_numpy(a)
    return i


def text_input(mod, texts, name="TEXT"):
    a = np.array([[t if isinstance(t, bytes) else t.encode("utf-8")] for t in texts], dtype=object)
    i = mod.InferInput(name, list(a.shape), "BYTES")
    i.set_data_from_numpy(a)
    return i


def out(mod, name):
    return [mod.InferRequestedOutput(name, binary_data=True)] if mod is th else [mod.InferRequestedOutput(name)]


def generate(mod, c, src, scores=False, model="reverse", **params):
    names = ["OUTPUT_IDS", "SCORES"] if scores else ["OUTPUT_IDS"]
    r = c.infer(model, [ids_input(mod, src)], outputs=[o for n in names for o in out(mod, n)],
                parameters=params or None)
    return (r.as_numpy("OUTPUT_IDS"), r.as_numpy("SCORES")) if scores else r.as_numpy("OUTPUT_IDS")


def test_generate_equals_python_api(server, api):
    """Greedy, sampling and beam search: tokens and SCORES (per-token log-probabilities; a
    beam's score) equal the Python API's with return_scores."""
    for proto, mod, c in clients(server):
        for opts in GEN_OPTIONS:
            for src in SOURCES:
                got, scores = generate(mod, c, src, scores=True, **opts)
                want = api["reverse"].generate([src], return_scores=True, **opts)[0]
                want_scores = want["log_probs"] if "log_probs" in want else [want["score"]]
                assert got.dtype == np.int32 and got.shape == (1, len(want["tokens"])), (proto, src, opts, got)
                assert got[0].tolist() == want["tokens"], (proto, src, opts)
                assert api["reverse"].generate([src], **opts)[0] == want["tokens"]  # scores change nothing
                assert scores.dtype == np.float32 and scores.shape == (1, len(want_scores)), (proto, opts, scores)
                assert scores[0].tolist() == np.asarray(want_scores, np.float32).tolist(), (proto, src, opts)
    assert generate(th, clients(server)[0][2], [3, 7, 1, 9]).tolist() == [[9, 1, 7, 3, 15]]


def stream(server, src, request_id="s", scores=None, model="reverse_stream", **params):
    """One generate_stream request over gRPC streaming: (tokens, error messages), each
    response's OUTPUT_IDS in order, until Triton's final (empty) response. `scores`: a list
    that gets each response's SCORES (asked for by name; otherwise only OUTPUT_IDS is)."""
    import queue
    q = queue.Queue()
    c = tg.InferenceServerClient(server.grpc)
    try:
        c.start_stream(callback=lambda result, error: q.put((result, error)))
        names = ["OUTPUT_IDS"] + (["SCORES"] if scores is not None else [])
        c.async_stream_infer(model, [ids_input(tg, src)], request_id=request_id,
                             parameters=params or None, enable_empty_final_response=True,
                             outputs=[tg.InferRequestedOutput(n) for n in names])
        tokens, errors = [], []
        while True:
            result, error = q.get(timeout=120)
            if error is not None:
                errors.append(str(error))
                break  # an error is the request's last response
            resp = result.get_response()
            if resp.outputs:
                ids = result.as_numpy("OUTPUT_IDS")
                assert ids.dtype == np.int32 and ids.shape == (1, 1), ids
                tokens.append(int(ids[0, 0]))
                s = result.as_numpy("SCORES")
                assert (s is None) == (scores is None), s  # SCORES only when asked for
                if scores is not None:
                    assert s.dtype == np.float32 and s.shape == (1, 1), s
                    scores.append(float(s[0, 0]))
            if resp.parameters["triton_final_response"].bool_param:
                break
        return tokens, errors
    finally:
        c.stop_stream()
        c.close()


def test_generate_stream_equals_python_api(server, api):
    """generate_stream sends each new token as its own response, as soon as it is chosen:
    together the same tokens as the Python API's generate (greedy and sampling); bad
    requests get one error response naming the problem, and the stream after works."""
    for src in SOURCES:
        for opts in ({}, {"max_new_tokens": 3}, {"sampling_topk": 0, "sampling_temperature": 0.8, "seed": 7}):
            tokens, errors = stream(server, src, **opts)
            assert not errors, (src, opts, errors)
            assert tokens == api["reverse"].generate([src], **opts)[0], (src, opts)
            # with SCORES: each token's log-probability, generate(return_scores=True)'s
            scores = []
            tokens, errors = stream(server, src, scores=scores, **opts)
            want = api["reverse"].generate([src], return_scores=True, **opts)[0]
            assert not errors and tokens == want["tokens"], (src, opts, errors)
            assert scores == np.asarray(want["log_probs"], np.float32).tolist(), (src, opts)
    bad = [([3, 7, 16], {}, ["INPUT_IDS[0][2] = 16", "vocabulary [0, 16)"]),
           ([3, 7], {"beam_size": 2}, ["beam_size", "kind generate"]),
           ([3, 7], {"max_new_tokens": 1000}, ["max_new_tokens 1000"]),
           ([[1, 2], [3, 4]], {}, ["INPUT_IDS"]),
           (np.zeros((1, 0), np.int32), {}, ["empty"])]
    for src, params, fragments in bad:
        tokens, errors = stream(server, src, **params)
        assert len(errors) == 1 and not tokens, (src, params, tokens, errors)
        for f in fragments:
            assert f in errors[0], (f, errors[0])
        print(f"stream: {errors[0][:160]}")
        assert stream(server, [3, 7, 1, 9])[0] == [9, 1, 7, 3, 15]


def test_decoder_generates_through_the_engine(server, api):
    """A decoder-only model's generate and generate_stream go through the continuous-batching
    engine: 8 streams from 8 threads (4 at a time in flight) and 8 generate requests from 8
    threads, greedy and seeded sampling, each get the Python API's tokens for that prompt
    alone, and SCORES its log-probabilities; beam search (the model's, not the engine's) is
    refused for a decoder-only model as the Python API refuses it."""
    import threading
    jobs = [([3 + 7 * j, 9, 4 + j][: 1 + j % 3], {"max_new_tokens": 4 + 3 * j} if j % 2 == 0 else
             {"sampling_topk": 20, "sampling_temperature": 0.8, "seed": 50 + j, "max_new_tokens": 12}) for j in range(8)]
    want = [api["gpt"].generate([p], return_scores=True, **o)[0] for p, o in jobs]
    got_stream, got_generate = [None] * 8, [None] * 8

    def one(j):
        scores = []
        tokens, errors = stream(server, jobs[j][0], request_id=f"g{j}", scores=scores, model="gpt_stream", **jobs[j][1])
        got_stream[j] = (tokens, scores, errors)
        c = th.InferenceServerClient(server.http)
        try:
            ids, sc = generate(th, c, jobs[j][0], scores=True, model="gpt", **jobs[j][1])
            got_generate[j] = (ids[0].tolist(), sc[0].tolist())
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(j,)) for j in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for j in range(8):
        tokens, scores, errors = got_stream[j]
        assert not errors and tokens == want[j]["tokens"], (j, jobs[j], got_stream[j], want[j])
        assert scores == np.asarray(want[j]["log_probs"], np.float32).tolist(), j
        assert got_generate[j] == (want[j]["tokens"], np.asarray(want[j]["log_probs"], np.float32).tolist()), j
    with pytest.raises(InferenceServerException, match="beam search"):  # the model's own refusal, as the API's
        generate(th, clients(server)[0][2], [5, 9, 13], model="gpt", beam_size=2, max_new_tokens=5)


def sse_stream(server, body):
    """POST /v2/models/reverse_stream/generate_stream (Triton's generate extension over
    HTTP, server-sent events): (tokens, error messages, HTTP status)."""
    req = urllib.request.Request(f"http://{server.http}/v2/models/reverse_stream/generate_stream",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        resp = urllib.request.urlopen(req, timeout=120)
    except urllib.error.HTTPError as e:
        resp = e
    tokens, errors = [], []
    with resp:
        for line in resp:  # one "data: {...}" line per event, then a blank line
            line = line.decode().strip()
            if not line:
                continue
            assert line.startswith("data: "), line
            event = json.loads(line[len("data: "):])
            if "error" in event:
                errors.append(event["error"])
            else:
                tokens.append(event["OUTPUT_IDS"])
                assert isinstance(event["SCORES"], float) and event["SCORES"] <= 0, event  # the token's log-prob
        return tokens, errors, resp.status


def test_generate_stream_over_http(server, api):
    """The same stream over HTTP: Triton's generate_stream endpoint sends one server-sent
    event per new token (JSON keys other than the input are the generation options)."""
    for src in SOURCES:
        for opts in ({}, {"max_new_tokens": 3}, {"sampling_topk": 0, "sampling_temperature": 0.8, "seed": 7}):
            tokens, errors, status = sse_stream(server, {"INPUT_IDS": src, **opts})
            assert status == 200 and not errors, (src, opts, status, errors)
            assert tokens == api["reverse"].generate([src], **opts)[0], (src, opts)
    for src, params, fragment in (([3, 7, 16], {}, "INPUT_IDS[0][2] = 16"), ([3, 7], {"beam_size": 2}, "beam_size")):
        tokens, errors, _ = sse_stream(server, {"INPUT_IDS": src, **params})
        assert not tokens and len(errors) == 1 and fragment in errors[0], (src, tokens, errors)
        print(f"http stream: {errors[0][:160]}")
        assert sse_stream(server, {"INPUT_IDS": [3, 7, 1, 9]})[0] == [9, 1, 7, 3, 15]


def test_embed_text_equals_python_api(server, api):
    want = [api["embed"].encode([t])[0] for t in TEXTS]
    assert np.array_equal(api["embed"].encode(TEXTS), np.stack(want))  # the API batched = one by one
    for proto, mod, c in clients(server):
        for t, w in zip(TEXTS, want):
            r = c.infer("minilm", [text_input(mod, [t])], outputs=out(mod, "EMBEDDING"))
            got = r.as_numpy("EMBEDDING")
            assert got.dtype == np.float32 and got.shape == (1, 384)
            assert np.array_equal(got[0], w), (proto, t[:40])
        # several texts in one request: rows in order
        r = c.infer("minilm", [text_input(mod, TEXTS)], outputs=out(mod, "EMBEDDING"))
        assert np.array_equal(r.as_numpy("EMBEDDING"), np.stack(want)), proto


def test_embed_text_json_output(server, api):
    """Plain JSON (curl-style, no binary outputs): the floats round-trip exactly to float32."""
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [TEXTS[0]]}]}
    req = urllib.request.Request(f"http://{server.http}/v2/models/minilm/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=60).read())
    got = np.asarray(r["outputs"][0]["data"], dtype=np.float32)
    assert r["outputs"][0]["name"] == "EMBEDDING" and r["outputs"][0]["shape"] == [1, 384]
    assert np.array_equal(got, api["embed"].encode([TEXTS[0]])[0])


def test_pooled_equals_python_api(server, api):
    for proto, mod, c in clients(server):
        for row in ID_ROWS:
            r = c.infer("minilm_pooled", [ids_input(mod, row)], outputs=out(mod, "OUTPUT"))
            got = r.as_numpy("OUTPUT")
            assert got.dtype == np.float32 and got.shape == (1, 384)
            assert np.array_equal(got[0], api["pooled"].pooled([row])[0]), (proto, row)


def batch_counts(server, model):
    s = json.loads(urllib.request.urlopen(f"http://{server.http}/v2/models/{model}/stats", timeout=10).read())
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in s["model_stats"][0].get("batch_stats", [])}


def new_batches(server, model, before, requests, timeout_s=10.0):
    """The batches (size: count) run since `before`, once they cover `requests` requests:
    Triton counts a batch after its responses are sent, so a client can hold its answer
    before the statistics show it (CI saw 32 of 48 requests counted right after the last
    response). Returns what it has after timeout_s if they never do."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = batch_counts(server, model)
        new = {b: n - before.get(b, 0) for b, n in after.items() if n > before.get(b, 0)}
        if sum(b * n for b, n in new.items()) >= requests or time.monotonic() > deadline:
            return new
        time.sleep(0.05)


def test_concurrent_clients_are_batched(server, api):
    """16 client threads send at once (a barrier per round), 3 rounds per model: with the
    test server's 20 ms queue delay Triton batches them; each result still equals the API's."""
    import threading
    models = ("reverse", "minilm", "minilm_pooled")
    before = {m: batch_counts(server, m) for m in models}
    n_clients, rounds = 16, 3
    barrier = threading.Barrier(n_clients)
    failures = []

    def client(c):
        cl = tg.InferenceServerClient(server.grpc) if c % 2 else th.InferenceServerClient(server.http)
        mod = tg if c % 2 else th
        cl.is_server_live()  # connected before the first round
        for r in range(rounds):
            for model in models:
                k = c + r * n_clients
                barrier.wait(timeout=120)
                try:
                    if model == "reverse":
                        x = SOURCES[k % len(SOURCES)]
                        ok = generate(mod, cl, x)[0].tolist() == api["reverse"].generate([x])[0]
                    elif model == "minilm":
                        x = TEXTS[k % 4]  # the short texts
                        got = cl.infer(model, [text_input(mod, [x])], outputs=out(mod, "EMBEDDING")).as_numpy("EMBEDDING")
                        ok = np.array_equal(got[0], api["embed"].encode([x])[0])
                    else:
                        x = ID_ROWS[k % len(ID_ROWS)]
                        got = cl.infer(model, [ids_input(mod, x)], outputs=out(mod, "OUTPUT")).as_numpy("OUTPUT")
                        ok = np.array_equal(got[0], api["pooled"].pooled([x])[0])
                    if not ok:
                        failures.append((model, c, r, "differs from the Python API"))
                except Exception as e:
                    failures.append((model, c, r, str(e)))
        cl.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    for m in models:
        new = new_batches(server, m, before[m], n_clients * rounds)
        print(m, "batch sizes (size: count) during the concurrent run:", dict(sorted(new.items())))
        assert sum(b * n for b, n in new.items()) == n_clients * rounds, (m, new)
        assert max(new) > 1, (m, new)


def expect_error(fn, *fragments):
    with pytest.raises(InferenceServerException) as e:
        fn()
    msg = str(e.value)
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_bad_requests_then_good(server, api):
    """Each bad request gets an error naming the problem; a good request right after works."""
    tried = 0
    for proto, mod, c in clients(server):
        def good():
            assert generate(mod, c, [3, 7, 1, 9])[0].tolist() == [9, 1, 7, 3, 15]
            r = c.infer("minilm", [text_input(mod, ["ok"])], outputs=out(mod, "EMBEDDING"))
            assert r.as_numpy("EMBEDDING").shape == (1, 384)

        bad = [
            (lambda: c.infer("reverse", [ids_input(mod, [1, 2], name="IDS")]), ["IDS"]),
            (lambda: c.infer("minilm", [ids_input(mod, [1, 2], name="INPUT_IDS")]), ["INPUT_IDS"]),
            (lambda: c.infer("reverse", [ids_input(mod, [1.0, 2.0], dtype=np.float32, triton_type="FP32")]), ["FP32"]),
            (lambda: c.infer("reverse", [ids_input(mod, [1, 2], dtype=np.int64, triton_type="INT64")]), ["INT64"]),
            (lambda: c.infer("minilm", [ids_input(mod, [[1, 2]], name="TEXT")]), ["TEXT"]),
            (lambda: c.infer("reverse", [ids_input(mod, [[[1, 2]]])]), ["INPUT_IDS", "shape"]),
            (lambda: c.infer("minilm", [text_input(mod, [b"a"])], outputs=out(mod, "NOPE")), ["NOPE"]),
            (lambda: c.infer("nosuchmodel", [ids_input(mod, [1])]), ["nosuchmodel"]),
            (lambda: c.infer("reverse", [ids_input(mod, [3, 7, 16])]), ["INPUT_IDS[0][2] = 16", "vocabulary [0, 16)"]),
            (lambda: c.infer("reverse", [ids_input(mod, [3, -1])]), ["= -1", "vocabulary"]),
            (lambda: c.infer("minilm_pooled", [ids_input(mod, [101, 40000])]), ["40000", "vocabulary [0, 30522)"]),
            (lambda: c.infer("reverse", [ids_input(mod, np.zeros((1, 0), np.int32))]), ["empty"]),
            (lambda: c.infer("reverse", [ids_input(mod, [[1, 2], [3, 4]])]), ["one sequence per request"]),
            (lambda: c.infer("reverse", [ids_input(mod, [1] * 65)]), ["65 tokens", "max_len 64"]),
            (lambda: c.infer("minilm", [text_input(mod, [b"x" * 5000])]), ["5000 bytes", "max_text_bytes 4096"]),
            (lambda: c.infer("minilm", [text_input(mod, [b"\xff\xfe"])]), ["UTF-8"]),
            (lambda: generate(mod, c, [3, 7], max_new_tokens=1000), ["max_new_tokens 1000"]),
            (lambda: generate(mod, c, [3, 7], max_new_tokens="many"), ["max_new_tokens", "integer"]),
            (lambda: generate(mod, c, [3, 7], sampling_topp=2.5), ["sampling_topp"]),
            (lambda: generate(mod, c, [3, 7], beam_size=0), ["beam_size 0"]),
            (lambda: generate(mod, c, [3, 7], beam_size=2, sampling_topk=5), ["beam search takes", "sampling_topk"]),
            (lambda: generate(mod, c, [3, 7], length_penalty=0.5), ["length_penalty applies to beam search"]),
        ]
        for fn, fragments in bad:
            msg = expect_error(fn, *fragments)
            assert ("[400]" in msg) or ("INVALID_ARGUMENT" in msg) or ("NOT_FOUND" in msg) or ("[404]" in msg), msg
            print(f"{proto}: {msg[:160]}")
            good()
            tried += 1
    # malformed JSON and a wrong body straight over HTTP
    for body in (b"{not json", b'{"inputs": 3}', b'{"inputs":[{"name":"INPUT_IDS","datatype":"INT32","shape":[1,2],"data":[1]}]}'):
        req = urllib.request.Request(f"http://{server.http}/v2/models/reverse/infer", data=body,
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        err = json.loads(e.value.read())["error"]
        print(f"http {e.value.code}: {body[:40]!r}: {err[:160]}")
        assert e.value.code in (400, 500) and err
        assert generate(th, clients(server)[0][2], [3, 7, 1, 9])[0].tolist() == [9, 1, 7, 3, 15]
        tried += 1
    print("bad requests tried:", tried)


def test_bad_request_in_a_batch_fails_alone(server, api):
    """Bad and good requests sent at once (so batched together): only the bad ones fail."""
    import threading
    before = batch_counts(server, "reverse")
    n = 16
    barrier, results = threading.Barrier(n), {}

    def client(k):
        c = th.InferenceServerClient(server.http)
        c.is_server_live()
        src = [3, 7, 99] if k % 4 == 0 else SOURCES[k % len(SOURCES)]
        barrier.wait(timeout=60)
        try:
            results[k] = (src, generate(th, c, src)[0].tolist())
        except InferenceServerException as e:
            results[k] = (src, e)
        c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == list(range(n))
    for k, (src, got) in results.items():
        if 99 in src:
            assert isinstance(got, InferenceServerException) and "INPUT_IDS[0][2] = 99" in str(got), got
        else:
            assert got == api["reverse"].generate([src])[0], (src, got)
    new = new_batches(server, "reverse", before, n - n // 4)  # at least the good requests
    print("mixed bad/good batch sizes:", new)
    assert max(new) > 1, new


def test_huge_body_and_disconnects_then_good(server):
    """A raw 8 MB HTTP body gets a 4xx/5xx error; clients that close mid-body or before
    reading the response do not stop the server: a correct request right after works."""
    import socket
    host, port = server.http.rsplit(":", 1)
    data = [1] * (2 * 1024 * 1024)  # ~8 MB of JSON, far over max_len
    body = json.dumps({"inputs": [{"name": "INPUT_IDS", "datatype": "INT32", "shape": [1, len(data)], "data": data}]}).encode()
    req = urllib.request.Request(f"http://{server.http}/v2/models/reverse/infer", data=body,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    err = e.value.read()
    print(f"http {e.value.code} for {len(body)} bytes: {err[:160]!r}")
    assert e.value.code == 400 and b"max_len 64" in err, (e.value.code, err[:200])  # names the problem
    c = clients(server)[0][2]
    assert generate(th, c, [3, 7, 1, 9])[0].tolist() == [9, 1, 7, 3, 15]
    good = json.dumps({"inputs": [{"name": "INPUT_IDS", "datatype": "INT32", "shape": [1, 4], "data": [3, 7, 1, 9]}]}).encode()
    head = (f"POST /v2/models/reverse/infer HTTP/1.1\r\nHost: {server.http}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(good)}\r\n\r\n").encode()
    for payload in (head + good[:10], head + good):  # partial body; full request, response never read
        for _ in range(3):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(payload)
            s.close()
    for proto, mod, cl in clients(server):
        assert generate(mod, cl, [3, 7, 1, 9])[0].tolist() == [9, 1, 7, 3, 15], proto
    assert server.proc.poll() is None
