"""`halformer import` refusals: a Hugging Face directory with one thing wrong fails,
naming it, and writes nothing; and a sliding window shorter than the positions caps
max_len (`window`)."""

import json
import os
import shutil
import subprocess

import numpy as np

from hf_models import LAYERS, LLAMA_POSITIONS


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
