"""halformer models behind Triton Inference Server (PyPI nvidia-pytriton), see docs/serving.md.

    python -m halformer.serve CONFIG.yaml [--http-port N] [--grpc-port N] [--metrics-port N]

CONFIG.yaml:

    server:                       # optional; ports default to Triton's 8000/8001/8002
      http_port: 8000
      grpc_port: 8001
      metrics_port: 8002
    models:
      - name: reverse             # Triton model name: [A-Za-z0-9._-]+, unique
        kind: generate            # generate | generate_stream | embed_text | pooled
        model_dir: build/models/reverse-tiny   # relative paths: relative to CONFIG.yaml
        weights: models/reverse-tiny.safetensors
        threads: 2                # Halide threads of this model (0: all cores)
        max_batch_size: 8         # Triton's max_batch_size (rows per batched call)
        max_queue_delay_microseconds: 2000     # dynamic batcher's wait for more requests
        instances: 2              # batches (generate_stream: streams) in flight at once (default 2)
      - name: minilm
        kind: embed_text
        model_dir: build/models/all-minilm-l6-v2
        weights: /path/model.safetensors
        vocab: /path/vocab.txt    # embed_text only
        max_text_bytes: 65536     # embed_text only: longer texts are rejected (default 65536)

Kinds (inputs and outputs carry Triton's batch dimension in front):
  generate:   INPUT_IDS int32 [-1]  -> OUTPUT_IDS int32 [-1], SCORES float32 [-1]
              (Model.generate with return_scores: SCORES holds each new token's
              log-probability, or with beam_size > 1 the best hypothesis' score; options as
              request parameters: max_new_tokens, beam_size, length_penalty, sampling_topk,
              sampling_topp, sampling_temperature, seed, repetition_penalty,
              no_repeat_ngram_size, min_length)
  generate_stream: INPUT_IDS int32 [1, -1] -> a stream of responses, each OUTPUT_IDS int32
              [1, 1] and SCORES float32 [1, 1]: one new token and its log-probability as
              soon as it is chosen (Model.generate_iter with return_scores; Triton's
              decoupled mode, gRPC streaming; the same tokens as generate; greedy or
              sampling options, not beam search); no batching keys: each request is its own
              stream (the rows of a dynamic batch would have to answer in lockstep)
  embed_text: TEXT bytes [1]        -> EMBEDDING float32 [d]   (SentenceEmbedder.encode)
  pooled:     INPUT_IDS int32 [-1]  -> OUTPUT float32 [X]      (Model.pooled)

The same file configures `python -m halformer.serve.ray` (Ray Serve, its own docstring),
which also takes a per-model `replicas:`; this Triton server refuses that key.

Readiness: GET /v2/health/ready (gRPC ServerReady) answers 200 only once every model
answers (tritonserver loads them all before its ports open), GET /v2/models/<name>/ready
once that model does (docs/serving.md).

Each batch Triton's dynamic batcher forms goes to the Python API in one call (for
generate: one call per distinct set of options in the batch, and one per sampling request,
whose tokens would otherwise depend on its place in the batch; for embed_text: length-
sorted sub-batches of EMBED_SUB_BATCH texts inside that call). When that call fails, the
requests are run one by one, so that each bad request gets its own error response (the
Python API's message) and the others their results.
"""

# The package in rooms: config.py (the YAML configuration), handler.py (requests -> the
# Python API -> responses), triton.py (pytriton: patches, binding, the server, main);
# ray.py (Ray Serve) is imported on its own. Every name that was here is re-exported.
import logging

from .config import (DEFAULT_GENERATE_QUEUE_DELAY_US, DEFAULT_INSTANCES, DEFAULT_MAX_BATCH_SIZE,  # noqa: F401
                     DEFAULT_MAX_QUEUE_DELAY_US, DEFAULT_MAX_TEXT_BYTES, GENERATE_KINDS, KINDS, ConfigError,
                     _int_field, _path_field, load_config)
from .handler import EMBED_SUB_BATCH, ERROR_KEY, GENERATE_PARAMETERS, _error, _error_text, _Served  # noqa: F401
from .triton import (_EXECUTE_ANCHOR, _EXECUTE_PATCH, _HANDSHAKE_ANCHOR, _HANDSHAKE_PATCH, _PATCH,  # noqa: F401
                     _PATCH_ANCHOR, _install_patches, main, serve)

log = logging.getLogger("halformer.serve")
