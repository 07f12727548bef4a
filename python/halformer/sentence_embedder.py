"""halformer.SentenceEmbedder: sentence embeddings from text with a built encoder-only model
(e.g. all-MiniLM-L6-v2), with sentence-transformers 2.2.2's encode() semantics."""
import logging
import os

import numpy as np

from ._native import BertTokenizer
from .checks import _existing_file, _int_arg
from .model import Model

logger = logging.getLogger("halformer")


class SentenceEmbedder:
    """Sentence embeddings from text with a built encoder-only model (head: embedding),
    e.g. all-MiniLM-L6-v2: the C++ BertTokenizer + Model.pooled, with
    sentence-transformers 2.2.2's encode() semantics.

    max_seq_length (tokens per text with [CLS] and [SEP]; longer texts are truncated):
    default, sentence_bert_config.json's max_seq_length when that file lies next to the
    weights (256 for all-MiniLM-L6-v2), else the model's max_len."""

    def __init__(self, model_dir, weights, vocab, max_seq_length=None, device="cpu", threads=0):
        vocab = _existing_file("vocabulary", vocab)
        self.model = Model(model_dir, weights, device=device, threads=threads)
        cfg = self.model.config
        if cfg["arch"] != "encoder" or cfg["head"] != "embedding":
            raise ValueError(f"SentenceEmbedder needs an encoder model with an embedding head; "
                             f"{cfg['name']} is {cfg['arch']} with head {cfg['head']}")
        self.tokenizer = BertTokenizer.from_vocab_file(vocab)
        if self.tokenizer.vocab_size > cfg["src_vocab"]:
            raise ValueError(f"vocabulary {vocab!r}: {self.tokenizer.vocab_size} tokens, more than the model's "
                             f"vocabulary of {cfg['src_vocab']} (is it this model's vocab.txt?)")
        if max_seq_length is None:
            st_config = os.path.join(os.path.dirname(os.path.abspath(os.fspath(weights))), "sentence_bert_config.json")
            if os.path.isfile(st_config):
                import json
                with open(st_config, encoding="utf-8") as f:
                    max_seq_length = json.load(f).get("max_seq_length")
            if max_seq_length is None:
                max_seq_length = cfg["max_len"]
        max_seq_length = _int_arg("max_seq_length", max_seq_length)
        if not 2 <= max_seq_length <= cfg["max_len"]:
            raise ValueError(f"max_seq_length {max_seq_length} is outside [2, {cfg['max_len']}] "
                             f"(2: [CLS] and [SEP]; the model's max_len is {cfg['max_len']})")
        self.max_seq_length = max_seq_length

    def encode(self, sentences, batch_size=32, show_progress_bar=None, convert_to_numpy=True,
               normalize_embeddings=False):
        """SentenceTransformer.encode (2.2.2): one str -> one embedding [d]; a list ->
        [N, d] numpy (convert_to_numpy) or a list of N 1-D arrays. Texts are sorted by
        length (longest first) into batches of batch_size, the results put back in input
        order. normalize_embeddings: L2-normalise each. show_progress_bar: a tqdm bar
        over the batches (None: when the `halformer` logger is at INFO or DEBUG)."""
        if show_progress_bar is None:
            show_progress_bar = logger.getEffectiveLevel() in (logging.INFO, logging.DEBUG)
        batch_size = _int_arg("batch_size", batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        input_was_string = False
        if isinstance(sentences, str) or not hasattr(sentences, "__len__"):
            sentences = [sentences]
            input_was_string = True
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise TypeError(f"sentences[{i}] must be a str, got {type(s).__name__}")
        # sentence-transformers' order: np.argsort of -len (quicksort, as it does).
        length_sorted_idx = np.argsort([-len(s) for s in sentences])
        sentences_sorted = [sentences[i] for i in length_sorted_idx]
        starts = range(0, len(sentences), batch_size)
        if show_progress_bar:
            from tqdm.autonotebook import trange
            starts = trange(0, len(sentences), batch_size, desc="Batches")
        all_embeddings = []
        for start in starts:
            texts = [s.strip() for s in sentences_sorted[start:start + batch_size]]  # as its Transformer does
            emb = self.model.pooled(self.tokenizer.encode_batch(texts, self.max_seq_length))
            if normalize_embeddings:  # torch.nn.functional.normalize(p=2, eps=1e-12)
                emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), np.float32(1e-12))
            all_embeddings.extend(emb)
        all_embeddings = [all_embeddings[i] for i in np.argsort(length_sorted_idx)]
        if convert_to_numpy:
            all_embeddings = np.asarray(all_embeddings)
        if input_was_string:
            all_embeddings = all_embeddings[0]
        return all_embeddings
