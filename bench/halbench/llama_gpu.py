"""A Llama-style decoder-only model (TinyLlama-1.1B's shapes, bench/gpu/tinyllama-1b.yaml)
for halbench.gpu: halformer's build against PyTorch on the same GPU, same random weights.

halformer_torch (the reference of the tests) models the torch.nn.Transformer family only:
no RMSNorm, rotary positions, grouped-query attention or gated feed-forward. So this
module writes the Llama block out as transformers' LlamaForCausalLM computes it (eager,
with its `sdpa` attention), reading the same state dict halformer loads (preset
huggingface-llama, docs/weights.md):

  x = embed_tokens[ids]                                          (no scale)
  per layer:  h = RMSNorm(x) · (offset + input_layernorm)        (in fp32, then cast back)
              q, k, v = h Wq^T, h Wk^T, h Wv^T                   (k, v: kv_heads heads)
              q, k rotated: rotate_half layout, cos/sin formed in fp32 as transformers does
              x = x + SDPA(q, cache k, cache v; causal) Wo^T     (query head h reads kv head h / (H / KVH))
              x = x + W_down(silu(W_gate h2) · W_up h2),  h2 = RMSNorm(x) · post_attention_layernorm
  logits = RMSNorm(x) · norm  lm_head^T                          (only the last position when decoding)

The KV cache is preallocated ([B, kv_heads, max positions, head size] per layer, written
in place), as a serving stack keeps it, so that a decode step does no concatenation.

  read_llama_spec(path)          the spec's fields this model needs (raises Unsupported otherwise)
  make_llama_weights(cfg, out)   seeded random weights (on the GPU when there is one), saved as
                                 BF16 safetensors, which halformer's loader widens exactly
  LlamaKV(cfg, state, dtype)     the model; forward(ids, pos0, cache) -> logits
  run(...)                       the benchmark section of halbench.gpu (--decoder-spec)
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from .common import REFERENCE_DIR, Unsupported
from .gpu import BF16_REL_TOL, log as _log


# -- the spec ------------------------------------------------------------------------------

def read_llama_spec(path: str) -> Dict[str, Any]:
    """The fields of a Llama-style spec this model computes, with halformer's defaults for
    those the spec leaves out (halformer_torch.load_spec: `halformer check --print-defaults`
    through the CLI, which the GPU bundle carries)."""
    if REFERENCE_DIR not in sys.path:
        sys.path.insert(0, REFERENCE_DIR)
    from halformer_torch import load_spec

    spec = load_spec(path)
    s, layer, emb = spec["sizes"], spec["layer"], spec["embedding"]
    att, tok = spec["attention"], spec["tokens"]
    want = {
        "architecture": (spec["architecture"], "decoder"),
        "layer.norm_kind": (layer["norm_kind"], "rms"),
        "layer.norm_placement": (layer["norm_placement"], "pre"),
        "layer.final_norm": (bool(layer["final_norm"]), True),
        "layer.activation": (layer["activation"], "swiglu"),
        "layer.parallel_residual": (bool(layer["parallel_residual"]), False),
        "embedding.positions": (emb["positions"], "rotary"),
        "embedding.scale": (bool(emb["scale"]), False),
        "attention.causal": (bool(att["causal"]), True),
        "head.kind": (spec["head"]["kind"], "logits"),
        "weights.preset": (spec["weights"]["preset"], "huggingface-llama"),
    }
    for key, (got, need) in want.items():
        if got != need:
            raise Unsupported(f"{path}: {key} is {got!r}; this Llama model needs {need!r}")
    d, h = int(s["d_model"]), int(s["heads"])
    hd = d // h
    cfg = {
        "name": spec.get("name", os.path.basename(path)),
        # derived defaults load_spec leaves unset (--print-defaults' "derived"): kv_heads =
        # heads, rotary_dim = the head size
        "d": d, "heads": h, "kv_heads": int(s.get("kv_heads", h)), "hd": hd,
        "d_ff": int(s["d_ff"]), "layers": int(s["decoder_layers"]), "vocab": int(s["tgt_vocab"]),
        "max_len": int(s["max_len"]),
        "eps": float(layer["norm_eps"]),
        "norm_offset": float(layer["norm_weight_offset"]),
        "theta": float(emb["rotary_theta"]),
        "rotary_dim": int(emb.get("rotary_dim", hd)),
        "rotary_layout": emb["rotary_layout"],
        "tied": bool(emb["share_tgt_output"]),
        "precision": spec["precision"],
        "pad": int(tok["pad"]), "bos": int(tok["bos"]), "eos": int(tok["eos"]),
    }
    if cfg["rotary_layout"] != "half":
        raise Unsupported(f"{path}: embedding.rotary_layout {cfg['rotary_layout']!r} (this model has 'half')")
    if h % cfg["kv_heads"] or cfg["rotary_dim"] % 2 or cfg["rotary_dim"] > hd:
        raise Unsupported(f"{path}: kv_heads / rotary_dim do not fit the heads")
    return cfg


def weight_shapes(cfg: Dict[str, Any]) -> Dict[str, Tuple[int, ...]]:
    """LlamaForCausalLM's names and shapes (huggingface-llama preset)."""
    d, f, kvd, v = cfg["d"], cfg["d_ff"], cfg["kv_heads"] * cfg["hd"], cfg["vocab"]
    out: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (v, d)}
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (d, d),
                    p + "self_attn.k_proj.weight": (kvd, d), p + "self_attn.v_proj.weight": (kvd, d),
                    p + "self_attn.o_proj.weight": (d, d), p + "post_attention_layernorm.weight": (d,),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f)})
    out["model.norm.weight"] = (d,)
    if not cfg["tied"]:
        out["lm_head.weight"] = (v, d)
    return out


def step_weight_bytes(cfg: Dict[str, Any], bytes_per_weight: int = 2) -> int:
    """Weights one decode step reads: every layer's matrices and norms, the final norm and
    lm_head, one embedding row (not the whole table)."""
    n = sum(math.prod(shape) for name, shape in weight_shapes(cfg).items() if name != "model.embed_tokens.weight")
    if cfg["tied"]:
        n += cfg["vocab"] * cfg["d"]  # lm_head is the table
    return (n + cfg["d"]) * bytes_per_weight


# -- weights -------------------------------------------------------------------------------

def make_llama_weights(cfg: Dict[str, Any], out: str, seed: int = 0, device: str = "cpu") -> Dict[str, torch.Tensor]:
    """Seeded random weights, made on `device` (the values depend on it: CUDA and CPU
    generators differ), rounded to bf16, written to `out` and returned (bf16, on device).

    LeCun-normal matrices (std 1/sqrt(fan_in)), so activations keep their scale through
    the 22 layers; norms 1 + N(0, 0.1) (every parameter matters); embeddings N(0, 1)."""
    t0 = time.time()
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    state = {}
    for name, shape in weight_shapes(cfg).items():
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            x = 1.0 - cfg["norm_offset"] + 0.1 * x
        elif "embed_tokens" not in name:
            x = x * (1.0 / math.sqrt(shape[1]))
        state[name] = x.to(torch.bfloat16)
    tmp = out + ".tmp"
    save_file({k: v.cpu() for k, v in state.items()}, tmp)
    os.replace(tmp, out)
    _log(f"random Llama weights (seed {seed}, {device}) -> {out} ({os.path.getsize(out) / 1e6:.0f} MB, "
         f"{time.time() - t0:.1f} s)")
    return state


# -- the model -----------------------------------------------------------------------------

_GQA_KW: Optional[bool] = None


def _sdpa_has_gqa() -> bool:
    """scaled_dot_product_attention(enable_gqa=...) exists (PyTorch >= 2.5)."""
    global _GQA_KW
    if _GQA_KW is None:
        try:
            q = torch.zeros(1, 2, 1, 4)
            F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
            _GQA_KW = True
        except (TypeError, RuntimeError, AttributeError):
            _GQA_KW = False
    return _GQA_KW


class LlamaKV:
    """The model in `dtype` (bf16 for the benchmark, fp32 for the reference), on the
    device of `state`'s tensors. Plain tensors, no nn.Module: the eager step is the
    kernels transformers launches, without its Python module overhead."""

    def __init__(self, cfg: Dict[str, Any], state: Dict[str, torch.Tensor], dtype: torch.dtype):
        self.cfg, self.dtype = cfg, dtype
        self.H, self.KVH, self.hd, self.d = cfg["heads"], cfg["kv_heads"], cfg["hd"], cfg["d"]
        self.eps, self.R = cfg["eps"], cfg["rotary_dim"]

        def w(name):
            return state[name].to(dtype)

        def norm(name):  # the offset added once, as halformer's loader does
            return (state[name].float() + cfg["norm_offset"]).to(dtype)

        self.embed = w("model.embed_tokens.weight")
        self.layers = []
        for i in range(cfg["layers"]):
            p = f"model.layers.{i}."
            self.layers.append(tuple(
                norm(p + n) if n.endswith("layernorm.weight") else w(p + n)
                for n in ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")))
        self.norm = norm("model.norm.weight")
        self.lm_head = self.embed if cfg["tied"] else w("lm_head.weight")
        dev = self.embed.device
        # transformers' LlamaRotaryEmbedding: inv_freq and the angles in fp32, cos/sin
        # cast to the activations' dtype at use.
        inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, self.R, 2, dtype=torch.int64).float() / self.R))
        freqs = torch.outer(torch.arange(cfg["max_len"], dtype=torch.float32), inv_freq)
        angles = torch.cat([freqs, freqs], dim=-1).to(dev)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        self.gqa_kw = self.sdpa and _sdpa_has_gqa()

    def new_cache(self, batch: int, length: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.KVH, length, self.hd)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.embed.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.embed.device)) for _ in self.layers]

    def _rms(self, x, w):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * x32.to(self.dtype)

    def _rope(self, x, cos, sin):  # x [B, heads, T, hd]; cos/sin [T, R]
        R = self.R
        xr = x[..., :R]
        rot = torch.cat([-xr[..., R // 2:], xr[..., : R // 2]], dim=-1)
        out = xr * cos + rot * sin
        return out if R == self.hd else torch.cat([out, x[..., R:]], dim=-1)

    def _attend(self, q, k, v, pos0: int):
        """q [B, H, T, hd] at positions pos0.. ; k, v [B, KVH, pos0 + T, hd]."""
        T, L = q.shape[2], k.shape[2]
        mask, causal = None, False
        if T > 1 and L == T:
            causal = True
        elif T > 1:  # a chunk after earlier positions: key j is seen by query i iff j <= pos0 + i
            mask = (torch.arange(L, device=q.device)[None, :]
                    <= (pos0 + torch.arange(T, device=q.device))[:, None])
        rep = self.H // self.KVH
        if self.sdpa and self.gqa_kw and rep > 1:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        # PyTorch < 2.0 (the CPU dry run here): the same formula
        s = torch.matmul(q, k.transpose(-1, -2)).float() / math.sqrt(self.hd)
        if causal:
            mask = torch.ones(T, L, dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1).to(v.dtype), v)

    def forward(self, ids: torch.Tensor, pos0: int, cache, last_only: bool = True) -> torch.Tensor:
        """ids [B, T] at positions pos0 .. pos0 + T - 1 (their keys and values written into
        the cache there) -> fp32 logits [B, V] (the last position) or [B, T, V]."""
        B, T = ids.shape
        H, KVH, hd = self.H, self.KVH, self.hd
        x = F.embedding(ids, self.embed)
        cos, sin = self.cos[pos0:pos0 + T], self.sin[pos0:pos0 + T]
        for (n1, wq, wk, wv, wo, n2, wg, wu, wd), (ck, cv) in zip(self.layers, cache):
            h = self._rms(x, n1)
            q = self._rope(F.linear(h, wq).view(B, T, H, hd).transpose(1, 2), cos, sin)
            k = self._rope(F.linear(h, wk).view(B, T, KVH, hd).transpose(1, 2), cos, sin)
            ck[:, :, pos0:pos0 + T] = k
            cv[:, :, pos0:pos0 + T] = F.linear(h, wv).view(B, T, KVH, hd).transpose(1, 2)
            a = self._attend(q, ck[:, :, :pos0 + T], cv[:, :, :pos0 + T], pos0)
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, self.d), wo)
            h = self._rms(x, n2)
            x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
        if last_only:
            x = x[:, -1:]
        logits = F.linear(self._rms(x, self.norm), self.lm_head).float()
        return logits[:, -1] if last_only else logits


# -- timing ----------------------------------------------------------------------------------

class _Timer:
    """Per-interval times: CUDA events on the GPU (read after one synchronise at the end),
    host wall time on the CPU."""

    def __init__(self, on_gpu: bool):
        self.on_gpu, self.marks = on_gpu, []

    def mark(self):
        if self.on_gpu:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> List[float]:
        if self.on_gpu:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def torch_greedy(model: LlamaKV, prompt: torch.Tensor, new_tokens: int, on_gpu: bool):
    """Fixed-length greedy decode of prompt [1, P] (eos does not stop it). Returns (tokens
    [new_tokens] list, step times ms of steps 2..N, prompt time ms: prefill + first token)."""
    P = prompt.shape[1]
    cache = model.new_cache(prompt.shape[0], P + new_tokens)
    timer = _Timer(on_gpu)
    timer.mark()
    tok = torch.argmax(model.forward(prompt, 0, cache), dim=-1)
    toks = [tok]
    timer.mark()
    for t in range(1, new_tokens):
        tok = torch.argmax(model.forward(tok[:, None], P + t - 1, cache), dim=-1)
        toks.append(tok)
        timer.mark()
    times = timer.intervals_ms()
    return torch.stack(toks, dim=1)[0].tolist(), times[1:], times[0]


def torch_prefill_ms(model: LlamaKV, prompt: torch.Tensor, warmup: int, repeat: int, on_gpu: bool) -> List[float]:
    """Prompt [1, P] through the model (causal SDPA), the last position's logits and argmax;
    the cache preallocated outside the timed region."""
    cache = model.new_cache(1, prompt.shape[1])
    out = []
    for i in range(warmup + repeat):
        timer = _Timer(on_gpu)
        timer.mark()
        torch.argmax(model.forward(prompt, 0, cache), dim=-1)
        timer.mark()
        if i >= warmup:
            out.append(timer.intervals_ms()[0])
    return out


def teacher_forced(model: LlamaKV, prompt: List[int], tokens: List[int], device: str) -> torch.Tensor:
    """fp32 logits [N, V] that chose tokens[0..N-1] after prompt (teacher forcing)."""
    ids = torch.tensor([prompt + tokens[:-1]], device=device)
    cache = model.new_cache(1, ids.shape[1])
    return model.forward(ids, 0, cache, last_only=False)[0, len(prompt) - 1:]


def choice_check(ref_logits: torch.Tensor, tokens: List[int]) -> Dict[str, Any]:
    """How far each greedy choice is from the fp32 reference's best on the same context:
    gap = max logit - chosen token's logit (0 where they agree), relative to the scale."""
    n = min(len(tokens), ref_logits.shape[0])
    chosen = ref_logits[torch.arange(n, device=ref_logits.device), torch.tensor(tokens[:n], device=ref_logits.device)]
    gap = (ref_logits[:n].max(dim=-1).values - chosen)
    scale = max(1.0, ref_logits.abs().max().item())
    return {"steps": n, "argmax_agrees": int((gap == 0).sum().item()),
            "max_gap": gap.max().item() if n else 0.0, "max_gap_rel": (gap.max().item() / scale) if n else 0.0,
            "ok": bool(n == 0 or gap.max().item() <= BF16_REL_TOL * scale)}


def common_prefix(a: List[int], b: List[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# -- the benchmark section ------------------------------------------------------------------

def run(spec_path: str, builds: Dict[str, Tuple[str, Dict[str, str]]], out_dir: str, dev: str, peaks: Dict[str, float],
        halformer_run, prompt_len: int = 32, new_tokens: int = 64, prefill_lens=(2048, 512), repeat: int = 3,
        seed: int = 0, keep_weights: bool = False) -> Dict[str, Any]:
    """TinyLlama-shaped decoding, batch 1: halformer builds (halformer_run(bench, env, ...)
    -> the JSON of bench/cpp/model_bench.cpp) against PyTorch bf16 eager (SDPA, KV cache).
    Returns the section of gpu_bench.json. Prefill lengths are cut to max_len (a prompt of
    P tokens and one new token fit when P <= max_len)."""
    on_gpu = dev == "cuda"
    cfg = read_llama_spec(spec_path)
    lens = []
    for n in prefill_lens:
        n = min(int(n), cfg["max_len"])
        if n > 0 and n not in lens:
            lens.append(n)
    new_tokens = min(new_tokens, cfg["max_len"] - prompt_len + 1)
    res: Dict[str, Any] = {"spec": cfg["name"], "prompt_len": prompt_len, "new_tokens": new_tokens,
                           "prefill_lens": lens, "checks": {}}
    weights = os.path.join(out_dir, f"{cfg['name']}.safetensors")
    state = make_llama_weights(cfg, weights, seed=seed, device=dev)
    params = sum(t.numel() for t in state.values())
    step_bytes = step_weight_bytes(cfg, 2)
    res.update({"params": params, "weight_bytes_per_step_bf16": step_bytes,
                "torch_sdpa": hasattr(F, "scaled_dot_product_attention"),
                "torch_sdpa_enable_gqa": hasattr(F, "scaled_dot_product_attention") and _sdpa_has_gqa()})
    gen = torch.Generator().manual_seed(seed + 1)
    prompt = torch.randint(4, cfg["vocab"], (1, prompt_len), generator=gen)  # no pad / bos / eos ids
    prompt_file = os.path.join(out_dir, f"{cfg['name']}_prompt.txt")
    with open(prompt_file, "w") as f:
        f.write(" ".join(map(str, prompt[0].tolist())) + "\n")
    # The prefill prompts: the ids of prompt_file repeated (what model_bench --prefill-len times).
    ids = prompt[0].tolist()
    long_ids = [(ids * (max(lens) // len(ids) + 1))[:n] for n in lens] if lens else []

    def gbps(ms):
        return step_bytes / ms / 1e6 if ms else None

    # PyTorch bf16 eager: greedy decode (one warm-up decode) and the prefills.
    with torch.inference_mode():
        m16 = LlamaKV(cfg, state, torch.bfloat16)
        p_dev = prompt.to(dev)
        torch_greedy(m16, p_dev, new_tokens, on_gpu)
        runs = [torch_greedy(m16, p_dev, new_tokens, on_gpu) for _ in range(repeat)]
        torch_tokens = runs[0][0]
        step = statistics.median(statistics.median(r[1]) for r in runs) if new_tokens > 1 else None
        prefill = {str(n): statistics.median(torch_prefill_ms(m16, torch.tensor([li], device=dev), 1, repeat, on_gpu))
                   for n, li in zip(lens, long_ids)}
        res["torch_bf16_eager"] = {"step_ms": step, "GBps": gbps(step),
                                   "prompt_ms": statistics.median(r[2] for r in runs), "prefill_ms": prefill}
        _log(f"{cfg['name']} torch bf16 eager: {step} ms/step, prefill ms {prefill}")
        del m16
        if on_gpu:
            torch.cuda.empty_cache()

    # halformer: decode (1 warm-up + `repeat` decodes) and the shortest prefill in one
    # process, each longer prefill in a process of its own (a kernel failing at a length,
    # or taking its process down, loses only that figure; past 635 keys the CUDA attention
    # kernel needs more than 48 KB of shared memory: see ptxas.json of the build). Each
    # process loads the weights again (seconds at TinyLlama's size).
    from safetensors.torch import load_file

    got = {}
    for name, (bench, env) in builds.items():
        dump = os.path.join(out_dir, f"{name}_{cfg['name']}.safetensors")
        try:
            first = ["--prefill-len", str(min(lens)), "--prefill-repeat", str(repeat)] if lens else []
            h = halformer_run(bench, env, dev, weights, prompt_file, "--skip-encoder", "--warmup", "1",
                              "--repeat", str(repeat), "--new-tokens", str(new_tokens), "--dump", dump, *first)
            got[name] = load_file(dump)
        except Exception as e:  # noqa: BLE001 - a failing build must not lose the others' rows
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            _log(f"{cfg['name']} {name}: {res[name]['error']}")
            continue
        step_h = statistics.median(statistics.median(r["step_ms"]) for r in h["decode"]) if new_tokens > 1 else None
        row = {"step_ms": step_h, "GBps": gbps(step_h), "steps": h["decode"][0]["steps"] + 1,
               "prompt_ms": statistics.median(r["prompt_ms"] for r in h["decode"]), "load_ms": h["load_ms"],
               "max_rss_bytes": h["max_rss_bytes"], "prefill_ms": {}, "prefill_error": {}}
        for n in sorted(lens):  # the shortest came with the decode
            if n == min(lens):
                pf = h.get("prefill", {})
            else:
                try:
                    pf = halformer_run(bench, env, dev, weights, prompt_file, "--skip-encoder", "--skip-decode",
                                       "--prefill-len", str(n), "--prefill-repeat", str(repeat)).get("prefill", {})
                except Exception as e:  # noqa: BLE001
                    pf = {"error": f"{type(e).__name__}: {e}"}
            if "ms" in pf:
                row["prefill_ms"][str(n)] = statistics.median(pf["ms"])
            else:
                row["prefill_error"][str(n)] = pf.get("error", "the driver reported no prefill")
        res[name] = row
        _log(f"{cfg['name']} {name}: {step_h} ms/step, prefill ms {row['prefill_ms']} {row['prefill_error'] or ''}")

    # Checks against the fp32 model on the same (bf16-rounded) weights, teacher-forced on
    # each engine's own tokens: a bf16 engine may flip a near-tie and then follow another
    # path, so token identity is reported, not required.
    with torch.inference_mode():
        m32 = LlamaKV(cfg, state, torch.float32)
        pl = prompt[0].tolist()
        ref_tokens, _, _ = torch_greedy(m32, prompt.to(dev), new_tokens, on_gpu)
        c = choice_check(teacher_forced(m32, pl, torch_tokens, dev), torch_tokens)
        c["same_tokens_as_fp32"] = common_prefix(torch_tokens, ref_tokens)
        res["checks"]["torch_bf16_greedy"] = c
        for name, g in got.items():
            toks = [t for t in g["greedy"][0].tolist() if t >= 0]
            ref = teacher_forced(m32, pl, toks, dev)
            c = choice_check(ref, toks)
            c["same_tokens_as_fp32"] = common_prefix(toks, ref_tokens)
            c["same_tokens_as_torch_bf16"] = common_prefix(toks, torch_tokens)
            last = g["last_logits"][0].to(ref.device)
            scale = max(1.0, ref[-1].abs().max().item())
            err = (last - ref[len(toks) - 1]).abs().max().item()
            c["last_logits"] = {"max_abs": err, "rel": err / scale, "ok": err <= BF16_REL_TOL * scale}
            res["checks"][f"{name}_greedy"] = c
        del m32
    if not keep_weights:  # 2.2 GB at TinyLlama's size: made again in seconds, never carried back
        os.remove(weights)
    return res


def print_table(res: Dict[str, Any], builds, copy_gbps: float) -> None:
    name, P, N, lens = res["spec"], res["prompt_len"], res["new_tokens"], res["prefill_lens"]
    t = res["torch_bf16_eager"]

    def f(x, fmt="{:.3f}"):
        return "n/a" if x is None else fmt.format(x)

    def bw(g):
        return f"{g:.0f}, {100 * g / copy_gbps:.0f}% copy" if g else "n/a"

    print(f"\n{name}: {res['params'] / 1e9:.2f} B parameters, {res['weight_bytes_per_step_bf16'] / 1e9:.2f} GB of "
          f"bf16 weights read per decode step; batch 1, prompt {P}, {N} new tokens (median step); ratios: "
          f"PyTorch ms / halformer ms")
    print(f"| {name} b1 | engine | decode ms/step (GB/s, % copy) | vs torch | "
          + " | ".join(f"prefill {n} ms | vs torch" for n in lens) + " |")
    print(f"| | torch bf16 eager (SDPA, KV cache) | {f(t['step_ms'])} ({bw(t['GBps'])}) | 1.00x | "
          + " | ".join(f"{f(t['prefill_ms'].get(str(n)), '{:.2f}')} | 1.00x" for n in lens) + " |")
    for b in builds:
        h = res.get(b, {})
        if "error" in h:
            print(f"| | {b} | error: {h['error'][:100]} | |" + " | |" * len(lens))
            continue
        ratio = f"{t['step_ms'] / h['step_ms']:.2f}x" if h.get("step_ms") and t["step_ms"] else "n/a"
        cells = []
        for n in lens:
            pf, tp = h["prefill_ms"].get(str(n)), t["prefill_ms"].get(str(n))
            if pf:
                cells.append(f"{pf:.2f} | {tp / pf:.2f}x" if tp else f"{pf:.2f} | n/a")
            else:
                cells.append(f"n/a ({h['prefill_error'].get(str(n), '')[:70]}) | n/a")
        print(f"| | {b} | {f(h.get('step_ms'))} ({bw(h.get('GBps'))}) | {ratio} | " + " | ".join(cells) + " |")
