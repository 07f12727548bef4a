"""The OpenAI-compatible API (python -m halformer.serve.openai; halformer/serve/openai.py)
through the official `openai` client: models, completions and chat completions, streamed
and not, equal to the Python API on the same model (greedy and seeded sampling); stop
strings; usage; OpenAI-format errors; clients that disconnect mid-stream leave the engine
empty;
readiness from the first moment; SIGTERM under load answers every accepted request.
Models: the imported Llama (tests/import fixtures; a word-level tokenizer.json with a
chat template beside it) and gpt-tiny (token ids only)."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

from conftest import BUILD, free_ports

LLAMA_DIR = os.path.join(BUILD, "import", "llama", "model")
LLAMA_WEIGHTS = os.path.join(BUILD, "import", "hf", "llama", "model.safetensors")
GPT_DIR = os.path.join(BUILD, "models", "gpt-tiny")
GPT_WEIGHTS = os.path.join(BUILD, "models", "gpt-tiny", "reference", "weights.safetensors")
VOCAB = 1003
TEMPLATE = "{% for m in messages %}{{ m['role'] }} w{{ m['content'] | length + 3 }} {% endfor %}w7"


def write_tokenizer(d):
    """tests/python/test_tokenizer.py's word-level tokenizer ("w3" ... "w1002", bos added) and a
    chat template: each message becomes its role (unknown: id 0) and w<3 + its length>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": TEMPLATE}, f)
    return os.path.join(d, "tokenizer.json")


class OpenAiServer:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="hfoai", dir="/tmp")
        self.tokenizer = write_tokenizer(self.tmp)
        config = os.path.join(self.tmp, "serve.yaml")
        with open(config, "w") as f:
            f.write(f"""models:
  - name: llama
    kind: generate
    model_dir: {LLAMA_DIR}
    weights: {LLAMA_WEIGHTS}
    tokenizer: {self.tokenizer}
    threads: 1
    max_sequences: 4
    prefill_tokens: 64
  - name: gpt
    kind: generate_stream
    model_dir: {GPT_DIR}
    weights: {GPT_WEIGHTS}
    threads: 1
    max_sequences: 2
    kv_cache_mb: 1
""")
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(self.tmp, "server.log"), "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "halformer.serve.openai", config, "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.tmp)

    def tail(self):
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()[-4000:]

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return r.status, json.loads(r.read())

    def wait_ready(self, timeout=120):
        """Polls /health/ready every 20 ms from the start; at the first 200 every model answers."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                status, _ = self.get("/health/ready")
                if status == 200:
                    print(f"\nready after {time.monotonic() - self.t0:.1f} s")
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"not ready after {timeout} s:\n{self.tail()}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = OpenAiServer()
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local(server):
    """The same models through the Python API in this process."""
    import halformer
    return {"llama": halformer.Model(LLAMA_DIR, weights=LLAMA_WEIGHTS, tokenizer=server.tokenizer),
            "gpt": halformer.Model(GPT_DIR, weights=GPT_WEIGHTS)}


def test_ready_means_answering(client):
    # wait_ready returned at the first 200 of /health/ready: every model answers at once.
    assert sorted(m.id for m in client.models.list()) == ["gpt", "llama"]
    r = client.completions.create(model="gpt", prompt=[5, 9, 13], max_tokens=2, temperature=0)
    assert r.choices[0].text


def test_completions_equal_python_api(client, local):
    prompt = "w5 w17 w300"
    want = local["llama"].generate(prompt, max_new_tokens=10)
    r = client.completions.create(model="llama", prompt=prompt, max_tokens=10, temperature=0)
    assert r.choices[0].text == want and r.object == "text_completion"
    n = r.usage.completion_tokens
    assert r.usage.prompt_tokens == 4 and 1 <= n <= 10
    assert r.choices[0].finish_reason == ("length" if n == 10 else "stop")
    chunks = list(client.completions.create(model="llama", prompt=prompt, max_tokens=10, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == n
    # seeded sampling: the Python API's tokens for that seed, twice
    want = local["llama"].generate(prompt, max_new_tokens=8, sampling_topk=0, sampling_temperature=0.7,
                                   sampling_topp=0.9, seed=42)
    for _ in range(2):
        r = client.completions.create(model="llama", prompt=prompt, max_tokens=8, temperature=0.7, top_p=0.9, seed=42)
        assert r.choices[0].text == want
    # token ids in, ids out as text (no tokenizer)
    ids = local["gpt"].generate([[5, 9, 13]], max_new_tokens=6)[0]
    r = client.completions.create(model="gpt", prompt=[5, 9, 13], max_tokens=6, temperature=0)
    assert r.choices[0].text == " ".join(map(str, ids))


def test_chat_and_stop(client, local, server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    prompt = "system w11 user w8 w7"  # TEMPLATE rendered
    want = local["llama"].generate(prompt, max_new_tokens=8)
    r = client.chat.completions.create(model="llama", messages=messages, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.object == "chat.completion" and r.usage.prompt_tokens == 6
    chunks = list(client.chat.completions.create(model="llama", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True))
    assert "".join((c.choices[0].delta.content or "") for c in chunks if c.choices) == want
    assert chunks[0].choices[0].delta.role == "assistant"
    # a stop string from inside the answer: the text before it, finish_reason "stop"
    words = want.split()
    r = client.chat.completions.create(model="llama", messages=messages, max_tokens=8, temperature=0, stop=[words[2]])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == want[:want.index(words[2])]


def test_errors_in_openai_format(client, server):
    import openai
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="w5")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="llama", prompt="w5", temperature=5)
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model="gpt", prompt=[5, 100000])
    with pytest.raises(openai.BadRequestError, match="tokenizer"):
        client.completions.create(model="gpt", prompt="text")
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="llama", messages=[])
    req = urllib.request.Request(server.url + "/v1/completions", data=b"{not json", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    body = json.loads(e.value.read())
    assert e.value.code == 400 and body["error"]["type"] == "invalid_request_error"


def test_disconnects_leave_the_engine_empty(client, server):
    # Clients that go away after their first token, 6 at once on 2 slots: afterwards
    # nothing runs or waits and every cache block is free again (a request whose client
    # left is cancelled, or has ended).
    streams = [client.completions.create(model="gpt", prompt=[5 + i, 9], max_tokens=120, temperature=0, stream=True)
               for i in range(6)]
    for st in streams:
        next(iter(st))
        st.close()
    def busy():
        return {name: (s["running"], s["waiting"], s["blocks_in_use"]) for name, s in server.get("/halformer/stats")[1].items()}

    end = time.monotonic() + 10
    while busy()["gpt"] != (0, 0, 0) and time.monotonic() < end:
        time.sleep(0.05)
    assert busy() == {"gpt": (0, 0, 0), "llama": (0, 0, 0)}
    assert server.get("/halformer/stats")[1]["gpt"]["blocks"] == 16  # kv_cache_mb: 1, blocks of 64 KiB


def test_sigterm_answers_accepted_requests(server):
    import openai
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    results, errors = [], []

    def one(i):
        try:
            r = c.completions.create(model="gpt", prompt=[5 + i, 9], max_tokens=40, temperature=0)
            results.append(r.choices[0].finish_reason)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # accepted and running (2 slots, 2 waiting)
    os.killpg(server.proc.pid, signal.SIGTERM)
    for t in threads:
        t.join()
    assert server.proc.wait(timeout=60) == 0, server.tail()
    assert not errors and len(results) == 4 and set(results) <= {"length", "stop"}, (errors, results)
