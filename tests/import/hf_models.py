"""The small random Hugging Face models of the import tests, made now with transformers
(`make`), their sizes and seeds, and the Llama-style reference of those families."""

import json
import os

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
# Encoder-decoders: the eos logit's bias (final_logits_bias), so that some greedy and beam
# hypotheses end before the limit.
EOS_BIAS = {"bart": 1.0, "marian": 2.5, "mbart": 3.0}


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
