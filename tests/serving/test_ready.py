"""Readiness (issue 42): a server's readiness endpoint says ready only when every configured
model answers. The endpoint is polled every 20 ms from the moment the process starts; at
the first "ready" one request goes to every model at once and each must succeed within
PROMPT_S; then the endpoint must stay ready. Triton: GET /v2/health/ready (a probe's) and,
on its own, every GET /v2/models/<name>/ready together; Ray Serve: GET /-/ready."""
import concurrent.futures as cf
import http.client
import json
import time
import urllib.error
import urllib.request

import pytest

from conftest import RayServer, Server, write_config

POLL_S = 0.02
READY_TIMEOUT_S = 180
REQUEST_TIMEOUT_S = 30
# Requests sent at "ready" must be answered within this: Ray queues requests for a replica
# that is still loading its model (6 s here), so "answered after a wait" is not enough.
# Triton's first requests wait up to ~1 s for pytriton to connect its Python side.
PROMPT_S = 3.0
SRC, WANT = [3, 7, 1, 9], [9, 1, 7]  # reverse-tiny, max_new_tokens 3
TEXT, IDS = "A man is eating food.", [101, 7592, 102]


def answer(url, body=None, timeout=2.0):
    """GET (body None) or POST JSON -> (HTTP status, or the exception's name; body bytes)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
        return type(e).__name__, b""


def events(body):
    """Server-sent events -> their JSON objects."""
    return [json.loads(line[len(b"data: "):]) for line in body.splitlines() if line.startswith(b"data: ")]


def triton_requests(server):
    """{model: () -> (ok, detail)}: one inference request per configured model."""
    base = f"http://{server.http}/v2/models"

    def infer(model, name, datatype, shape, data, output, want=None, **params):
        def send():
            status, body = answer(f"{base}/{model}/infer", {
                "inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}],
                "parameters": params}, REQUEST_TIMEOUT_S)
            if status != 200:
                return False, f"{status} {body[:200]!r}"
            got = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
            return output in got and (want is None or got[output] == want), f"{status} {str(got)[:80]}"
        return send

    def stream():
        status, body = answer(f"{base}/reverse_stream/generate_stream", {"INPUT_IDS": SRC, "max_new_tokens": 3},
                              REQUEST_TIMEOUT_S)
        tokens = [e.get("OUTPUT_IDS") for e in events(body)]
        return status == 200 and tokens == WANT, f"{status} {tokens or body[:200]!r}"

    return {"reverse": infer("reverse", "INPUT_IDS", "INT32", [1, 4], SRC, "OUTPUT_IDS", WANT, max_new_tokens=3),
            "minilm": infer("minilm", "TEXT", "BYTES", [1, 1], [TEXT], "EMBEDDING"),
            "minilm_pooled": infer("minilm_pooled", "INPUT_IDS", "INT32", [1, 3], IDS, "OUTPUT"),
            "reverse_stream": stream}


def ray_requests(server):
    def post(model, body, key, want=None):
        def send():
            status, text = answer(f"{server.url}/{model}", body, REQUEST_TIMEOUT_S)
            if status != 200:
                return False, f"{status} {text[:200]!r}"
            got = json.loads(text)
            return key in got and (want is None or got[key] == want), f"{status} {str(got)[:80]}"
        return send

    def stream():
        status, body = answer(f"{server.url}/reverse_stream", {"input_ids": SRC, "max_new_tokens": 3},
                              REQUEST_TIMEOUT_S)
        tokens = [e.get("output_id") for e in events(body)]
        return status == 200 and tokens == WANT, f"{status} {tokens or body[:200]!r}"

    return {"reverse": post("reverse", {"input_ids": SRC, "max_new_tokens": 3}, "output_ids", WANT),
            "minilm": post("minilm", {"text": TEXT}, "embedding"),
            "minilm_pooled": post("minilm_pooled", {"input_ids": IDS}, "output"),
            "reverse_stream": stream}


def ready_status(urls):
    """200 when every url says 200, else the first other answer."""
    for url in urls:
        status, _ = answer(url)
        if status != 200:
            return status
    return 200


def check_readiness(proc, t0, probes, requests, tail):
    """Polls every probe (a list of urls: ready when all say 200) from t0 (the process'
    start) until one says ready, then sends every request at once: all must succeed; then
    every probe must stay ready for a second."""
    changes = []  # (seconds since start, answer of each probe) each time an answer changes
    while True:
        status = [ready_status(urls) for urls in probes]
        t = time.monotonic() - t0
        if not changes or changes[-1][1] != status:
            changes.append((round(t, 2), status))
        if 200 in status:
            break
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}; readiness {changes}\n{tail()}")
        if t > READY_TIMEOUT_S:
            pytest.fail(f"not ready after {READY_TIMEOUT_S} s; readiness {changes}\n{tail()}")
        time.sleep(POLL_S)
    with cf.ThreadPoolExecutor(len(requests)) as pool:
        futures = {m: pool.submit(send) for m, send in requests.items()}
        results = {m: f.result() for m, f in futures.items()}
    took = time.monotonic() - t0 - t
    print(f"\nreadiness (s since start, answers): {changes}; a request to each of {len(requests)} models "
          f"at {t:.2f} s: {took:.2f} s")
    failed = {m: detail for m, (ok, detail) in results.items() if not ok}
    assert not failed, f"ready at {t:.2f} s but these models did not answer: {failed}; readiness {changes}"
    assert took < PROMPT_S, f"ready at {t:.2f} s but the models took {took:.2f} s to answer: still loading"
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        status = [ready_status(urls) for urls in probes]
        assert status == [200] * len(probes), f"ready, answered every model, then {status} at {time.monotonic() - t0:.2f} s"
        time.sleep(POLL_S)


def test_triton_ready_only_when_every_model_answers(tmp_path):
    config = write_config(str(tmp_path / "serve.yaml"), stream=True)
    t0 = time.monotonic()
    server = Server(config, str(tmp_path))
    try:
        # The server-wide endpoint (a readiness probe's) and each model's own.
        requests = triton_requests(server)
        models = [f"http://{server.http}/v2/models/{m}/ready" for m in requests]
        check_readiness(server.proc, t0, [[f"http://{server.http}/v2/health/ready"], models], requests, server.tail)
    finally:
        server.kill()


def test_ray_ready_only_when_every_model_answers():
    t0 = time.monotonic()
    server = RayServer(replicas={"reverse": 2})
    try:
        check_readiness(server.proc, t0, [[f"{server.url}/-/ready"]], ray_requests(server), server.tail)
        assert "halformer.serve.ray: ready" in server.tail(100000)
    finally:
        server.kill()
