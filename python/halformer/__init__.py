"""halformer: run models built from a YAML spec (``halformer build``) from Python.

    import halformer
    halformer.build("models/reverse-tiny.yaml", "out/reverse-tiny")   # runs the CLI
    m = halformer.Model("out/reverse-tiny", weights="models/reverse-tiny.safetensors")
    m.generate([[3, 7, 1, 9]])                       # [[9, 1, 7, 3, 15]]
    m.generate([[3, 7, 1, 9]], beam_size=3, return_scores=True)
    for row, token in m.generate_iter([[3, 7, 1, 9], [5, 6]]): ...
    m.encode([[3, 7, 1, 9]])                         # numpy float32 [1, 4, d_model]

    e = halformer.SentenceEmbedder("out/all-minilm-l6-v2", weights, vocab)
    e.encode(["A man is eating food.", "Someone eats."])   # numpy float32 [2, 384]

API
  build(spec, out_dir)       runs ``halformer build SPEC -o OUT_DIR`` (the CLI of the
                             source tree this package was built from, or $HALFORMER_TOOL),
                             its output streamed to sys.stdout; returns OUT_DIR.
  import_model(source, spec_out, name=None, weights_out=None, force=False)
                             ``halformer import``: a spec (GGUF: and its weights and
                             tokenizer) for a Hugging Face directory or a GGUF file.
  Model(model_dir, weights, device="cpu", threads=0, tokenizer=None)
                             loads DIR/lib<name>.so (or that .so's path) with the weights.
                             threads: per-call thread limit (<= 0: every core).
                             tokenizer: a Hugging Face `tokenizers.Tokenizer` (or the path of
                             a tokenizer.json): then every method also takes a str or a list
                             of str where it takes token ids (encoded without special tokens
                             unless the tokenizer's post-processor adds them), and generate()
                             of text returns text (the new tokens, decoded with
                             skip_special_tokens=True).
    .config                  dict of the spec's values (halformer/model_config.h)
    .encode(batch, lengths=None)    encoder output, float32 [B, T, d_model]
    .pooled(batch, lengths=None)    head vector per sequence, [B, num_classes | d_model]
    .score(src, tgt=None, ...)      head output [B, T, tgt_vocab] (tgt: teacher-forced
                             decoder inputs, encoder-decoder; decoder-only: over src)
    .generate(src, max_new_tokens=None, beam_size=1, length_penalty=None,
              sampling_topk=1, sampling_topp=1.0, sampling_temperature=1.0, seed=0,
              repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0,
              return_scores=False)
                             a list of token lists (new tokens, eos included when made);
                             beam_size > 1: the best hypothesis per source. With
                             return_scores: a list of dicts {"tokens", "log_probs"} (one
                             log-probability per token), or for beam search
                             {"tokens", "score"} (sum of log-probs / length^penalty).
                             Option semantics: halformer/generation.h (Hugging Face's).
    .generate_iter(src, ...)  the same options (not beam search): yields (row, token) as
                             each token is chosen, with return_scores (row, token,
                             log_prob), the log_probs generate() returns; generation runs
                             in a background thread.
  Engine(model, max_sequences=8, max_len=None, prefill_tokens=512)   decoder-only models:
    .submit(prompt, max_new_tokens=None, ..., stop=None)   continuous batching: requests join
                             and leave the running batch at every step; returns a Stream
                             of token ids (an iterator), the tokens model.generate gives the
                             prompt alone. .submit_async(...): the same for `async for`.
  SentenceEmbedder(model_dir, weights, vocab, max_seq_length=None, device="cpu", threads=0)
    .encode(sentences, batch_size=32, show_progress_bar=None,
            convert_to_numpy=True, normalize_embeddings=False)
                             sentence-transformers 2.2.2's SentenceTransformer.encode for
                             these arguments (tokenized by halformer's C++ BertTokenizer).
  BertTokenizer.from_vocab_file(path)   .encode(text, max_length), .encode_batch(...),
                             .tokenize(text): halformer/tokenizer.h.

A batch is a list of token-id lists (lengths may differ) or a 2-D integer numpy array
(with ``lengths=``: row i is its first lengths[i] ids). Errors: ValueError for bad
values (ids outside the vocabulary, sequences too long, an empty batch, options out of
range, weights that do not fit the model) with the runtime's message; TypeError for
wrong types; FileNotFoundError for a missing model directory, weights or vocabulary.

Models are independent values: several (the same or different ones) live in one process
and may be called from several Python threads at once; the GIL is released while the
kernels run.
"""
# The package in rooms: building.py (build), checks.py (argument checks), library.py (a
# model's .so), model.py (Model, text through a tokenizer), sentence_embedder.py.
from . import _native  # noqa: F401  (halformer._native, as before)
from ._native import BertTokenizer
# The private names are re-exported too, where they were before (tests call halformer._pack).
from .building import PRECISIONS, _BUILT_TOOL, _tool, build, import_model  # noqa: F401
from .checks import _existing_file, _float_arg, _int32_row, _int_arg, _is_int, _pack  # noqa: F401
from .library import _find_library, _loadable, _loaded, _loaded_lock  # noqa: F401
from .model import _DONE, Model, _text_tokenizer  # noqa: F401
from .engine import Engine, Stream  # noqa: F401
from .sentence_embedder import SentenceEmbedder, logger  # noqa: F401

__all__ = ["build", "import_model", "Model", "Engine", "SentenceEmbedder", "BertTokenizer"]
