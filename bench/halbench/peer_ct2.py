"""CTranslate2 peer: CPU, compute_type float32 (task "ct2_compute_type": int8_float32 for
bench/run --precision int8), intra_threads = `threads`, inter_threads 1.

The model is built with CTranslate2's Python spec API from the same safetensors weights
(no checkpoint converter fits a bare torch.nn.Transformer state_dict):
  ctranslate2.specs.TransformerSpec.from_config((enc, dec), heads, pre_norm=<spec>, ...)
  * norm_placement post -> pre_norm=False (LayerNorm(x + f(x)), as Marian / fairseq base);
    each sublayer's LayerNorm: self_attention.layer_norm = norm1, attention.layer_norm =
    norm2 (decoder), ffn.layer_norm = norm2 (encoder) / norm3 (decoder);
  * fused QKV = in_proj_weight as is (rows q, k, v); cross-attention: linear[0] = q rows,
    linear[1] = k and v rows (fused), linear[2] = out_proj;
  * positions: the sinusoidal table of halformer_torch (interleaved sin/cos) set
    explicitly, since CT2's built-in table is laid out differently; scale_embeddings = True
    multiplies by sqrt(d) like the spec; projection = generator (+ bias).
  * vocabulary: ids are what matter; token strings are "<blank>" (pad), "<s>" (bos),
    "</s>" (eos), "<unk>" (the first non-special id) and "t<ID>" for the rest.
Scenarios:
  * encoder: a TransformerEncoderModelSpec holding the same encoder, run by
    ctranslate2.Encoder.forward_batch (the only CT2 API that returns encoder output, so it
    is also what the encoder check compares).
  * decode: Translator.translate_batch(beam_size=1) with min = max decoding length, so
    every run does exactly N steps. CT2 exposes no per-step timing, so per-step time =
    (T(N steps) - T(1 step)) / (N - 1): the difference removes the encoder, the
    cross-attention K/V and the batch set-up, as in the other systems' step times.
  * check: an unforced run (min_decoding_length 1, stops at eos like halformer); CT2 does
    not return scores per step, so a divergence is judged with PyTorch's margins (see
    common.check_tokens).
"""
from __future__ import annotations

import json
import os
import sys
import time

from .common import (ENCODER_REL_TOL, REDUCED_ENCODER_REL_TOL, REFERENCE_DIR, Unavailable, Unsupported, check_encoder,
                     check_tokens, conversion_stamp, is_current, load_reference, peer_main, read_sources,
                     record_step_times, reduced_precision_check, timed_runs)


def vocabulary(v, pad, bos, eos):
    toks = [f"t{i}" for i in range(v)]
    toks[pad], toks[bos], toks[eos] = "<blank>", "<s>", "</s>"
    unk = next(i for i in range(v) if i not in (pad, bos, eos))
    toks[unk] = "<unk>"
    return toks


def build(spec_path, weights, out_dir, log):
    import ctranslate2
    import numpy as np
    from ctranslate2.specs import common_spec, transformer_spec
    from safetensors.numpy import load_file

    sys.path.insert(0, REFERENCE_DIR)
    from halformer_torch import load_spec

    stamp, stamp_path = conversion_stamp(out_dir, weights, spec_path, ct2=ctranslate2.__version__)
    if is_current(stamp, stamp_path):
        return

    spec = load_spec(spec_path)
    s, layer, emb = spec["sizes"], spec["layer"], spec["embedding"]
    if layer["norm_kind"] != "standard":
        raise Unsupported(f"layer.norm_kind {layer['norm_kind']!r}")
    pre = layer["norm_placement"] == "pre"
    if layer["final_norm"] and not pre:
        raise Unsupported("post-norm with final_norm (CT2 has a final LayerNorm only for pre-norm)")
    if pre and not layer["final_norm"]:
        no_final = True
    else:
        no_final = False
    if emb["positions"] != "sinusoidal" and emb["positions"] != "learned":
        raise Unsupported(f"embedding.positions {emb['positions']!r}")
    if spec["head"]["kind"] not in ("log_softmax", "logits", "softmax"):
        raise Unsupported(f"head.kind {spec['head']['kind']!r}")
    act = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
           "gelu_tanh": common_spec.Activation.GELUTanh}[layer["activation"]]
    d = int(s["d_model"])
    w = load_file(weights)
    if emb["positions"] == "sinusoidal":
        from halformer_torch import sinusoidal_positions

        pe = sinusoidal_positions(int(s["max_len"]), d).numpy()
    else:
        pe = w["pos_embedding.weight"]

    def ln(dst, prefix):
        dst.gamma = w[prefix + ".weight"]
        dst.beta = w[prefix + ".bias"]

    def lin(dst, weight, bias):
        dst.weight = np.ascontiguousarray(weight)
        dst.bias = np.ascontiguousarray(bias)

    def self_attention(dst, p):  # packed QKV, output projection, norm1 of layer prefix p
        lin(dst.linear[0], w[p + ".self_attn.in_proj_weight"], w[p + ".self_attn.in_proj_bias"])
        lin(dst.linear[1], w[p + ".self_attn.out_proj.weight"], w[p + ".self_attn.out_proj.bias"])
        ln(dst.layer_norm, p + ".norm1")

    def ffn(dst, p, norm):
        ln(dst.layer_norm, p + "." + norm)
        lin(dst.linear_0, w[p + ".linear1.weight"], w[p + ".linear1.bias"])
        lin(dst.linear_1, w[p + ".linear2.weight"], w[p + ".linear2.bias"])

    def encoder_spec():
        e = transformer_spec.TransformerEncoderSpec(int(s["encoder_layers"]), int(s["heads"]), pre_norm=pre,
                                                    no_final_norm=no_final, activation=act)
        e.embeddings[0].weight = w["src_embedding.weight"]
        e.scale_embeddings = bool(emb["scale"])
        e.position_encodings.encodings = pe
        for i, L in enumerate(e.layer):
            p = f"transformer.encoder.layers.{i}"
            self_attention(L.self_attention, p)
            ffn(L.ffn, p, "norm2")
        if hasattr(e, "layer_norm"):
            ln(e.layer_norm, "transformer.encoder.norm")
        return e

    dec = transformer_spec.TransformerDecoderSpec(int(s["decoder_layers"]), int(s["heads"]), pre_norm=pre,
                                                  no_final_norm=no_final, activation=act)
    dec.embeddings.weight = w["tgt_embedding.weight"]
    dec.scale_embeddings = bool(emb["scale"])
    dec.position_encodings.encodings = pe
    for i, L in enumerate(dec.layer):
        p = f"transformer.decoder.layers.{i}"
        self_attention(L.self_attention, p)
        ipw, ipb = w[p + ".multihead_attn.in_proj_weight"], w[p + ".multihead_attn.in_proj_bias"]
        lin(L.attention.linear[0], ipw[:d], ipb[:d])
        lin(L.attention.linear[1], ipw[d:], ipb[d:])
        lin(L.attention.linear[2], w[p + ".multihead_attn.out_proj.weight"], w[p + ".multihead_attn.out_proj.bias"])
        ln(L.attention.layer_norm, p + ".norm2")
        ffn(L.ffn, p, "norm3")
    if hasattr(dec, "layer_norm"):
        ln(dec.layer_norm, "transformer.decoder.norm")
    lin(dec.projection, w["generator.weight"], w["generator.bias"])

    tok = spec["tokens"]
    src_vocab = vocabulary(int(s["src_vocab"]), tok["pad"], tok["bos"], tok["eos"])
    tgt_vocab = vocabulary(int(s["tgt_vocab"]), tok["pad"], tok["bos"], tok["eos"])
    t0 = time.time()
    model = transformer_spec.TransformerSpec(encoder_spec(), dec)
    model.config.layer_norm_epsilon = float(layer["norm_eps"])
    model.config.decoder_start_token = "<s>"
    model.register_source_vocabulary(src_vocab)
    model.register_target_vocabulary(tgt_vocab)
    model.validate()
    model.optimize(quantization=None)
    os.makedirs(os.path.join(out_dir, "seq2seq"), exist_ok=True)
    model.save(os.path.join(out_dir, "seq2seq"))

    enc_model = transformer_spec.TransformerEncoderModelSpec(encoder_spec())
    enc_model.config.layer_norm_epsilon = float(layer["norm_eps"])
    enc_model.register_vocabulary(src_vocab)
    enc_model.validate()
    enc_model.optimize(quantization=None)
    os.makedirs(os.path.join(out_dir, "encoder"), exist_ok=True)
    enc_model.save(os.path.join(out_dir, "encoder"))
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    log(f"built CTranslate2 models in {out_dir} ({time.time() - t0:.1f} s)")


def body(task, res):
    try:
        import ctranslate2
        import numpy as np
    except ImportError as e:
        raise Unavailable(f"ctranslate2 is not installed ({e})")
    os.makedirs(os.path.join(task["work"], "ct2"), exist_ok=True)
    ct2_dir = os.path.join(task["work"], "ct2")
    build(task["spec"], task["weights"], ct2_dir, res.note)
    th = task["threads"]
    ctype = task.get("ct2_compute_type", "float32")
    reduced = ctype != "float32"
    translator = ctranslate2.Translator(os.path.join(ct2_dir, "seq2seq"), device="cpu", compute_type=ctype,
                                        intra_threads=th, inter_threads=1)
    encoder = ctranslate2.Encoder(os.path.join(ct2_dir, "encoder"), device="cpu", compute_type=ctype,
                                  intra_threads=th, inter_threads=1)
    res.data["versions"] = {"ctranslate2": ctranslate2.__version__, "compute_type": ctype,
                            "intra_threads": th, "CT2_USE_MKL": os.environ.get("CT2_USE_MKL", "(default)")}
    s = task["sizes"]
    vocab = vocabulary(s["src_vocab"], task["pad"], task["bos"], task["eos"])
    tvocab = vocabulary(s["tgt_vocab"], task["pad"], task["bos"], task["eos"])
    index = {t: i for i, t in enumerate(tvocab)}
    n, eos = task["new_tokens"], task["eos"]
    if n < 2:
        raise Unsupported("per-step time needs at least 2 new tokens (it is a difference of two runs)")

    for b in task["batches"]:
        info = task["inputs"][str(b)]
        ids = read_sources(info["src"])
        src_tokens = [[vocab[i] for i in row] for row in ids]
        ref_enc, ref_greedy = load_reference(info["reference"])

        if "encoder" in task["scenarios"]:
            def run_enc():
                return encoder.forward_batch(ids)
            out = np.array(run_enc().last_hidden_state)
            if res.check("encoder", b, check_encoder(out, ref_enc, REDUCED_ENCODER_REL_TOL if reduced else ENCODER_REL_TOL)):
                res.timing("encoder", b, timed_runs(run_enc, task["warmup"], task["repeat_encoder"]))

        if "decode" in task["scenarios"]:
            def translate(steps, forced):
                return translator.translate_batch(src_tokens, beam_size=1, max_decoding_length=steps,
                                                  min_decoding_length=steps if forced else 1,
                                                  return_end_token=True, max_batch_size=0)
            hyps = [[index[t] for t in r.hypotheses[0]] for r in translate(n, False)]
            margins = paths = None
            mpath = os.path.join(task["work"], "peers", "pytorch", f"greedy_b{b}.json")
            if os.path.exists(mpath):
                with open(mpath) as f:
                    m = json.load(f)
                margins, paths = m["margins"], m["tokens"]
            tok = check_tokens(hyps, ref_greedy.tolist(), eos, margins, paths)
            if res.check("decode", b, reduced_precision_check(tok) if reduced else tok):
                forced = translate(n, True)
                if any(len(r.hypotheses[0]) != n for r in forced):
                    res.note(f"forced decode b{b} returned {[len(r.hypotheses[0]) for r in forced]} tokens, "
                             f"expected {n}")
                t_n = timed_runs(lambda: translate(n, True), task["warmup"], task["repeat_decode"])
                t_1 = timed_runs(lambda: translate(1, True), task["warmup"], task["repeat_decode"])
                record_step_times(res, b, t_n, t_1, n)


if __name__ == "__main__":
    peer_main("ctranslate2", body)
