"""An OpenAI-compatible API over halformer's continuous-batching engine (docs/serving.md).

    python -m halformer.serve.openai CONFIG.yaml [--port N] [--host H]

CONFIG.yaml is halformer.serve's format (its docstring); each model is a decoder-only
`generate` (or `generate_stream`) model and takes, instead of the batcher's keys:

      - name: gpt                 # the OpenAI "model" id
        kind: generate
        model_dir: build/models/gpt-tiny
        weights: w.safetensors
        tokenizer: tokenizer.json # text in and out (tokenizers); without it prompts are token ids
        max_sequences: 8          # sequences decoded together (engine slots)
        prefill_tokens: 512       # prompt tokens prefilled per step
        kv_cache_mb: 0            # the paged key/value cache, MiB (0: room for max_sequences x max_len)

Endpoints (FastAPI on uvicorn): GET /v1/models; POST /v1/completions and
/v1/chat/completions with model, prompt / messages, max_tokens (default 16), temperature
(default 1; 0: greedy), top_p, seed, stop (a string or a list of up to 4), stream
(server-sent events, ending with `data: [DONE]`), n = 1; usage counts; errors as OpenAI's
{"error": {"message", "type", "param", "code"}}. Chat prompts use the tokenizer's chat
template where it has one (tokenizer_config.json beside tokenizer.json), else
"<role>: <content>" lines and "assistant:". GET /health/ready answers 200 once every
model is loaded: the port opens only then; GET /halformer/stats gives each engine's running
and waiting counts. SIGTERM: running requests finish first (uvicorn's graceful shutdown),
then the engines close.
"""
import argparse
import asyncio
import json
import os
import secrets
import sys
import time
import uuid

from .config import ConfigError, engine_for, load_config

DEFAULT_MAX_TOKENS = 16  # OpenAI's completions default


class ApiError(Exception):
    def __init__(self, status, message, param=None, kind="invalid_request_error", code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self):
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class Served:
    """One configured model: the Model, its Engine, its tokenizer and chat template."""

    def __init__(self, entry):
        import halformer
        self.name = entry["name"]
        self.model = halformer.Model(entry["model_dir"], weights=entry["weights"], threads=entry["threads"],
                                     tokenizer=entry["tokenizer"])
        if self.model.config["arch"] != "decoder":
            raise ConfigError(f"model {self.name!r}: the OpenAI API serves decoder-only models "
                              f"({self.model.config['name']} is {self.model.config['arch']})")
        self.engine = engine_for(self.model, entry)
        self.tokenizer = self.model.tokenizer
        self.template = _chat_template(entry["tokenizer"])
        self.created = int(time.time())

    def encode(self, text):
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids):
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def _chat_template(tokenizer_path):
    """The chat template of tokenizer_config.json beside tokenizer.json, compiled (jinja2),
    or None."""
    if not tokenizer_path:
        return None
    cfg = os.path.join(os.path.dirname(tokenizer_path), "tokenizer_config.json")
    try:
        with open(cfg, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
    except (OSError, ValueError):
        return None
    if not isinstance(template, str):
        return None
    import jinja2
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template)


def _field(body, key, types, default, check=None, what=None):
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) and bool not in types or not isinstance(v, types):
        raise ApiError(400, f"'{key}' must be {what or ' or '.join(t.__name__ for t in types)}, got {json.dumps(v)}", key)
    if check and not check(v):
        raise ApiError(400, f"'{key}' {json.dumps(v)} is out of range ({what})", key)
    return v


class Api:
    def __init__(self, served):
        self.served = {s.name: s for s in served}

    def model(self, body):
        name = body.get("model")
        if not isinstance(name, str):
            raise ApiError(400, "'model' is required (a string)", "model")
        if name not in self.served:
            raise ApiError(404, f"The model '{name}' does not exist (served: {', '.join(self.served)})", "model",
                           code="model_not_found")
        return self.served[name]

    def options(self, body, s):
        """The engine's submit() options, and the stop strings."""
        max_tokens = _field(body, "max_tokens", (int,), DEFAULT_MAX_TOKENS, lambda v: v >= 1, "an integer >= 1")
        if "max_completion_tokens" in body:
            max_tokens = _field(body, "max_completion_tokens", (int,), max_tokens, lambda v: v >= 1, "an integer >= 1")
        temperature = _field(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 2, "in [0, 2]")
        top_p = _field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "in (0, 1]")
        seed = _field(body, "seed", (int,), None, lambda v: 0 <= v < 2**64, "in [0, 2**64)")
        n = _field(body, "n", (int,), 1, lambda v: v == 1, "only n = 1 is served")
        del n
        stop = body.get("stop")
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        if not (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(x, str) and x for x in stop)):
            raise ApiError(400, "'stop' must be a non-empty string or a list of up to 4 of them", "stop")
        o = dict(max_new_tokens=max_tokens, seed=secrets.randbits(63) if seed is None else seed)
        if temperature > 0:
            o.update(sampling_topk=0, sampling_temperature=float(temperature), sampling_topp=float(top_p))
        else:
            o.update(sampling_topk=1)
        return o, stop

    def prompt_ids(self, body, s, chat):
        if chat:
            messages = body.get("messages")
            if not (isinstance(messages, list) and messages and all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in messages)):
                raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects with strings",
                               "messages")
            if s.tokenizer is None:
                raise ApiError(400, f"model '{s.name}' has no tokenizer: chat needs one (tokenizer: in the config)",
                               "messages")
            if s.template is not None:
                text = s.template.render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")
            else:
                text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
            return s.encode(text)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if s.tokenizer is None:
                raise ApiError(400, f"model '{s.name}' has no tokenizer: give 'prompt' as token ids", "prompt")
            return s.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt
        raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt)", "prompt")

    def start(self, body, chat):
        """Checks a request and submits it: (served, stream, prompt ids, stop strings)."""
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        s = self.model(body)
        o, stop = self.options(body, s)
        ids = self.prompt_ids(body, s, chat)
        try:
            stream = s.engine.submit_async(ids, **o)
        except (ValueError, TypeError) as e:
            raise ApiError(400, str(e), "prompt" if not chat else "messages") from None
        return s, stream, ids, stop


async def _run(s, stream, stop, ids):
    """Yields (text delta, finish_reason or None) as tokens come, appending each token to
    `ids`; ends at a stop string (cancelling the request) or when the request ends. Without
    a tokenizer the delta is the token ids as text, space-separated."""
    sent = 0
    try:
        async for token in stream:
            ids.append(token)
            if s.tokenizer is None:
                yield (" " if len(ids) > 1 else "") + str(token), None
                continue
            text = s.decode(ids)
            cut = min((i for i in (text.find(x) for x in stop) if i >= 0), default=-1)
            if cut >= 0:
                if cut > sent:
                    yield text[sent:cut], None
                yield "", "stop"
                return
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
                continue
            if len(text) > sent:
                yield text[sent:], None
                sent = len(text)
        yield "", "length" if stream.finish_reason == "length" else "stop"
    finally:
        stream.cancel()  # a stop string, or a client gone: the slot is freed at the next step


def create_app(api, on_ready=None):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="halformer OpenAI-compatible API")
    if on_ready:
        app.add_event_handler("startup", on_ready)

    @app.exception_handler(ApiError)
    async def api_error(request, e):
        return JSONResponse(e.body(), status_code=e.status)

    @app.get("/health/ready")
    async def ready():
        return {"ready": True, "models": list(api.served)}

    # Each engine's sequences running, requests waiting, and its cache. A plain def (FastAPI's
    # thread pool): reading an engine waits for its step in progress, which must not hold the loop.
    @app.get("/halformer/stats")
    def stats():
        return {s.name: {"running": s.engine.running, "waiting": s.engine.waiting, **s.engine.stats()}
                for s in api.served.values()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": s.name, "object": "model", "created": s.created,
                                            "owned_by": "halformer"} for s in api.served.values()]}

    async def complete(request, chat):
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None
        s, stream, ids, stop = api.start(body, chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def usage(n):
            return {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}

        def choice(delta, finish, streaming):
            if not chat:
                return {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            if streaming:
                return {"index": 0, "delta": {"content": delta} if delta else {}, "logprobs": None,
                        "finish_reason": finish}
            return {"index": 0, "message": {"role": "assistant", "content": delta}, "logprobs": None,
                    "finish_reason": finish}

        new = []  # the request's tokens, as _run sees them
        if not _field(body, "stream", (bool,), False, what="a boolean"):
            text, finish = "", None
            async for delta, f in _run(s, stream, stop, new):
                text, finish = text + delta, f or finish
            return {"id": rid, "object": kind, "created": created, "model": s.name,
                    "choices": [choice(text, finish, False)], "usage": usage(len(new))}

        async def events():
            chunk = kind + ".chunk" if chat else kind
            if chat:
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}
                yield f"data: {json.dumps({'id': rid, 'object': chunk, 'created': created, 'model': s.name, 'choices': [first]})}\n\n"
            async for delta, finish in _run(s, stream, stop, new):
                if not delta and not finish:
                    continue
                yield "data: " + json.dumps({"id": rid, "object": chunk, "created": created, "model": s.name,
                                             "choices": [choice(delta, finish, True)]}) + "\n\n"
            yield "data: " + json.dumps({"id": rid, "object": chunk, "created": created, "model": s.name,
                                         "choices": [], "usage": usage(len(new))}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, True)

    return app


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m halformer.serve.openai",
                                 description="An OpenAI-compatible API over halformer models (docs/serving.md).")
    ap.add_argument("config", help="YAML configuration (see the module docstring)")
    ap.add_argument("--port", type=int, help="HTTP port (default: the config's server.http_port, else 8000)")
    ap.add_argument("--host", default="127.0.0.1")
    a = ap.parse_args(argv)
    try:
        config = load_config(a.config, openai=True)
        served = [Served(entry) for entry in config["models"]]
    except (ConfigError, ValueError, TypeError, FileNotFoundError) as e:
        print(f"halformer.serve.openai: error: {e}", file=sys.stderr, flush=True)
        return 2
    import uvicorn
    port = a.port or config["server"]["http_port"]
    def ready():
        print(f"halformer.serve.openai: ready: {', '.join(s.name for s in served)} on http://{a.host}:{port}/v1",
              flush=True)

    server = uvicorn.Server(uvicorn.Config(create_app(Api(served), ready), host=a.host, port=port,
                                           log_level="warning", timeout_graceful_shutdown=120))
    try:
        asyncio.run(server.serve())  # SIGTERM / SIGINT: stops accepting, finishes running requests
    finally:
        for s in served:
            s.engine.close()
    print("halformer.serve.openai: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
