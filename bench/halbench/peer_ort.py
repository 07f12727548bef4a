"""ONNX Runtime peer: CPU execution provider, intra-op threads = `threads`, inter-op 1,
graph optimisation level ORT_ENABLE_ALL (ORT's own fusions: MatMul+Add -> Gemm /
FusedMatMul, LayerNorm, GELU, ... applied at session creation).

The graphs are exported with torch.onnx.export (TorchScript exporter, dynamo=False, opset
17) from kv_model.KVSeq2Seq - the same weights and function as the reference:
  encoder.onnx   src [B, S] int64 -> memory [B, S, d]
  cross_kv.onnx  memory -> per decoder layer K, V [B, H, S, hd]   (once per source)
  step.onnx      tok [B, 1], pos [1], mem_mask [B, 1, 1, S], past K/V [B, H, t, hd] x 2L,
                 cross K/V x 2L -> head output [B, V], present K/V x 2L
Why not export Seq2Seq directly: nn.TransformerDecoder has no KV cache, so a faithful
export would re-run the whole prefix every step (quadratic); the step graph with past /
present K/V is how encoder-decoder models are deployed on ORT (e.g. Hugging Face Optimum).
The exported files are cached in the work directory, keyed by the weights file.
With task "ort_quantize": "int8" (system onnxruntime-int8) each graph is first quantized
by onnxruntime.quantization.quantize_dynamic (int8 weights per channel, activations
quantized at run time: ORT's recipe for CPU transformers), cached beside them; its
outputs are checked against fp32 within the reduced-precision bound, its greedy tokens
reported only.
Decoding feeds numpy arrays to InferenceSession.run each step (the plain API; IOBinding
would save the copies of the growing K/V tensors, a few % at these sizes).
"""
from __future__ import annotations

import json
import os
import sys
import time

from .common import (ENCODER_REL_TOL, REDUCED_ENCODER_REL_TOL, REFERENCE_DIR, Unavailable, check_encoder, check_tokens, conversion_stamp,
                     is_current, load_reference, peer_main, read_sources, reduced_precision_check, timed_runs)

OPSET = 17


def export(spec_path, weights, out_dir, log):
    import torch

    from .kv_model import KVSeq2Seq, load_state

    sys.path.insert(0, REFERENCE_DIR)
    from halformer_torch import load_spec

    stamp, stamp_path = conversion_stamp(out_dir, weights, spec_path, torch=torch.__version__, opset=OPSET)
    if is_current(stamp, stamp_path):
        return
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    spec = load_spec(spec_path)
    m = KVSeq2Seq(spec, load_state(weights)).eval()
    L = m.n_dec
    kw = {"opset_version": OPSET, "do_constant_folding": True}
    if _has_kwarg(torch.onnx.export, "dynamo"):  # torch >= 2.5: keep the TorchScript exporter
        kw["dynamo"] = False

    class Enc(torch.nn.Module):
        def forward(self, src):
            return m.encode(src)

    class Cross(torch.nn.Module):
        def forward(self, memory):
            return tuple(m.cross_kv(memory))

    class Step(torch.nn.Module):
        def forward(self, tok, pos, mem_mask, *kv):
            scores, present = m.step(tok, pos, mem_mask, list(kv[:2 * L]), list(kv[2 * L:]))
            return (scores, *present)

    b, s, t = 2, 5, 3
    src = torch.randint(3, 10, (b, s))
    kvn = [f"{kind}{i}" for i in range(L) for kind in ("k", "v")]
    with torch.no_grad():
        torch.onnx.export(Enc(), (src,), os.path.join(out_dir, "encoder.onnx"), input_names=["src"],
                          output_names=["memory"], dynamic_axes={"src": {0: "B", 1: "S"}, "memory": {0: "B", 1: "S"}},
                          **kw)
        memory = m.encode(src)
        torch.onnx.export(Cross(), (memory,), os.path.join(out_dir, "cross_kv.onnx"), input_names=["memory"],
                          output_names=["cross_" + n for n in kvn],
                          dynamic_axes={"memory": {0: "B", 1: "S"}, **{"cross_" + n: {0: "B", 2: "S"} for n in kvn}},
                          **kw)
        cross = m.cross_kv(memory)
        past = [torch.randn(b, m.h, t, m.hd) for _ in range(2 * L)]
        args = (torch.randint(3, 10, (b, 1)), torch.tensor([t]), m.key_mask(src), *past, *cross)
        names = ["tok", "pos", "mem_mask"] + ["past_" + n for n in kvn] + ["cross_" + n for n in kvn]
        dyn = {"tok": {0: "B"}, "mem_mask": {0: "B", 3: "S"}, "scores": {0: "B"}}
        dyn.update({"past_" + n: {0: "B", 2: "T"} for n in kvn})
        dyn.update({"cross_" + n: {0: "B", 2: "S"} for n in kvn})
        dyn.update({"present_" + n: {0: "B", 2: "T1"} for n in kvn})
        torch.onnx.export(Step(), args, os.path.join(out_dir, "step.onnx"), input_names=names,
                          output_names=["scores"] + ["present_" + n for n in kvn], dynamic_axes=dyn, **kw)
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    log(f"exported ONNX graphs to {out_dir} ({time.time() - t0:.1f} s)")


GRAPHS = ("encoder.onnx", "cross_kv.onnx", "step.onnx")


def quantize_int8(onnx_dir, out_dir, spec_path, log):
    """The exported graphs through quantize_dynamic (cached, keyed by the fp32 graphs)."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    stamp, stamp_path = conversion_stamp(out_dir, os.path.join(onnx_dir, GRAPHS[0]), spec_path,
                                         onnxruntime=onnxruntime.__version__, per_channel=True,
                                         constants_as_initializers=True)
    if is_current(stamp, stamp_path):
        return
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    for g in GRAPHS:
        # quantize_dynamic quantizes a MatMul only when its weight is an initializer; the
        # TorchScript export leaves the weights as Constant nodes: moved first.
        fp32_with_initializers = os.path.join(out_dir, "fp32_" + g)
        onnx.save(_constants_as_initializers(onnx.load(os.path.join(onnx_dir, g))), fp32_with_initializers)
        quantize_dynamic(fp32_with_initializers, os.path.join(out_dir, g), weight_type=QuantType.QInt8,
                         per_channel=True)
        os.remove(fp32_with_initializers)
        quantized = sum(n.op_type == "MatMulInteger" for n in onnx.load(os.path.join(out_dir, g)).graph.node)
        if not quantized:
            raise RuntimeError(f"quantize_dynamic left {g} without an int8 MatMul")
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    log(f"quantized the ONNX graphs (dynamic int8) to {out_dir} ({time.time() - t0:.1f} s)")


def _constants_as_initializers(model):
    """The model with every Constant node's tensor moved into the graph's initializers."""
    graph = model.graph
    keep = []
    for n in graph.node:
        value = next((a.t for a in n.attribute if a.name == "value"), None) if n.op_type == "Constant" else None
        if value is None:
            keep.append(n)
            continue
        value.name = n.output[0]
        graph.initializer.append(value)
    del graph.node[:]
    graph.node.extend(keep)
    return model


def _has_kwarg(fn, name):
    import inspect

    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def body(task, res):
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        raise Unavailable(f"onnxruntime is not installed ({e})")
    try:
        import torch  # noqa: F401  (only to export the graphs)
    except ImportError as e:
        raise Unavailable(f"torch (needed to export the ONNX graphs) is not installed ({e})")

    onnx_dir = os.path.join(task["work"], "onnx")
    export(task["spec"], task["weights"], onnx_dir, res.note)
    reduced = task.get("ort_quantize") == "int8"
    if reduced:
        quantize_int8(onnx_dir, os.path.join(onnx_dir, "int8"), task["spec"], res.note)
        onnx_dir = os.path.join(onnx_dir, "int8")

    so = ort.SessionOptions()
    so.intra_op_num_threads = task["threads"]
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    prov = ["CPUExecutionProvider"]
    enc = ort.InferenceSession(os.path.join(onnx_dir, "encoder.onnx"), so, providers=prov)
    crs = ort.InferenceSession(os.path.join(onnx_dir, "cross_kv.onnx"), so, providers=prov)
    stp = ort.InferenceSession(os.path.join(onnx_dir, "step.onnx"), so, providers=prov)
    res.data["versions"] = {"onnxruntime": ort.__version__, "providers": prov, "opset": OPSET,
                            "intra_op_threads": task["threads"], "graph_optimization": "ORT_ENABLE_ALL",
                            "quantization": "quantize_dynamic int8 per channel" if reduced else "none"}
    kvn = [o.name[len("present_"):] for o in stp.get_outputs()[1:]]
    L2 = len(kvn)
    h_hd = stp.get_inputs()[3].shape[1], stp.get_inputs()[3].shape[3]
    pad, bos, eos, n = task["pad"], task["bos"], task["eos"], task["new_tokens"]
    positions = [np.array([t], dtype=np.int64) for t in range(n)]

    def prefill(src):
        mem = enc.run(None, {"src": src})[0]
        cross = crs.run(None, {"memory": mem})
        feeds = {"cross_" + kvn[i]: cross[i] for i in range(L2)}
        feeds["mem_mask"] = ((src == pad).astype(np.float32) * -1e9)[:, None, None, :]
        return feeds

    def decode(src, feeds, with_scores=False):
        b = src.shape[0]
        past = [np.zeros((b, h_hd[0], 0, h_hd[1]), np.float32) for _ in range(L2)]
        tok = np.full((b, 1), bos, np.int64)
        toks, margins = [[] for _ in range(b)], [[] for _ in range(b)]
        for t in range(n):
            feeds["tok"] = tok
            feeds["pos"] = positions[t]
            for i in range(L2):
                feeds["past_" + kvn[i]] = past[i]
            out = stp.run(None, feeds)
            scores, past = out[0], out[1:]
            nxt = scores.argmax(-1)
            if with_scores:
                top2 = np.sort(scores, axis=-1)[:, -2:]
                for r in range(b):
                    toks[r].append(int(nxt[r]))
                    margins[r].append(float(top2[r, 1] - top2[r, 0]))
            tok = nxt[:, None].astype(np.int64)
        return toks, margins

    for b in task["batches"]:
        info = task["inputs"][str(b)]
        src = np.array(read_sources(info["src"]), dtype=np.int64)
        ref_enc, ref_greedy = load_reference(info["reference"])
        if "encoder" in task["scenarios"]:
            out = enc.run(None, {"src": src})[0]
            if res.check("encoder", b, check_encoder(out, ref_enc, REDUCED_ENCODER_REL_TOL if reduced else ENCODER_REL_TOL)):
                res.timing("encoder", b, timed_runs(lambda: enc.run(None, {"src": src}), task["warmup"],
                                                    task["repeat_encoder"]))
        if "decode" in task["scenarios"]:
            toks, margins = decode(src, prefill(src), with_scores=True)
            tok = check_tokens(toks, ref_greedy.tolist(), eos, margins)
            if res.check("decode", b, reduced_precision_check(tok) if reduced else tok):
                samples = []
                for i in range(task["warmup"] + task["repeat_decode"]):
                    feeds = prefill(src)
                    t0 = time.perf_counter()
                    decode(src, feeds)
                    if i >= task["warmup"]:
                        samples.append((time.perf_counter() - t0) * 1e3 / n)
                res.timing("decode", b, samples, steps=n)


if __name__ == "__main__":
    peer_main("onnxruntime", body)
