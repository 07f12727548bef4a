"""The reference's self-test: python tests/reference/halformer_torch [SPEC...]
(default models/reverse-tiny.yaml): fast path == slow path (torch preset), other presets
== their torch-preset conversion, beam search with K = 1 == greedy."""
from __future__ import annotations

import copy
import os
import sys

import torch
import torch.nn as nn

if __package__ in (None, ""):  # run as a directory: import the package by its name
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from halformer_torch import (beam_search, build_model, export_state, greedy,  # noqa: E402
                             load_spec, load_weights, randomize_, to_torch_preset)


def _self_test(path: str) -> None:
    spec = load_spec(path)
    m = randomize_(build_model(spec), 0).eval()
    arch, s = spec["architecture"], spec["sizes"]
    special = {m.pad, m.bos, m.eos}
    vocab = int(s["tgt_vocab"] if arch == "decoder" else s["src_vocab"])
    allowed = torch.tensor([t for t in range(vocab) if t not in special])
    gen = torch.Generator().manual_seed(0)
    src = allowed[torch.randint(0, len(allowed), (3, 9), generator=gen)]
    src[1, 1:] = m.pad
    src[2, 5:] = m.pad
    valid_src = (src != m.pad)[..., None]
    if arch == "encoder_decoder":
        tv = int(s["tgt_vocab"])
        allowed_t = torch.tensor([t for t in range(tv) if t not in special])
        tgt = allowed_t[torch.randint(0, len(allowed_t), (3, 6), generator=gen)]
        tgt[:, 0] = m.bos
        tgt[1, 2:] = m.pad
        valid = (tgt != m.pad)[..., None]
        run = lambda mod: mod(src, tgt)  # noqa: E731
    elif arch == "encoder":
        valid = valid_src
        run = lambda mod: mod.encode(src)  # noqa: E731
    else:
        valid = valid_src
        run = lambda mod: mod(src)  # noqa: E731
    report = []
    with torch.no_grad():
        out = run(m)
        if spec["weights"]["preset"] == "torch.nn.Transformer":
            slow = copy.deepcopy(m).train()  # dropout 0 -> same function, slow path everywhere
            for mod in slow.modules():
                if isinstance(mod, nn.Dropout):
                    mod.p = 0.0
                if isinstance(mod, nn.MultiheadAttention):
                    mod.dropout = 0.0
            report.append(("fast - slow", float(((out - run(slow)).abs() * valid).max())))
        else:
            t_spec, t_state = to_torch_preset(spec, export_state(m))
            t = build_model(t_spec)
            missing, unexpected = load_weights(t, t_state)
            assert not missing and not unexpected, (missing, unexpected)
            t.eval()
            report.append(("preset - torch preset", float(((out - run(t)).abs() * valid).max())))
            if arch == "encoder":
                a, b = m.head_output(out, src), t.head_output(run(t), src)
                if a is not None:
                    report.append(("head: preset - torch preset", float((a - b).abs().max())))
                if hasattr(m, "classifier") and spec["head"]["pooling"] == "cls":
                    hf = m(input_ids=src, attention_mask=(src != m.pad).long(),
                           token_type_ids=torch.zeros_like(src)).logits
                    report.append(("classifier: ours - HF forward", float((hf - a).abs().max())))
        if arch == "encoder_decoder":
            g = greedy(m, src[:1], 6)[0]
            b1, _ = beam_search(m, src[0].tolist(), 1, 6, 1.0)
            assert b1[0][0] == g, (b1, g)
            report.append(("beam K=1 == greedy", 0.0))
    print(f"{path}: " + ", ".join(f"{k} {v:.2g}" for k, v in report))


if __name__ == "__main__":
    import sys

    torch.set_num_threads(2)
    for p in sys.argv[1:] or ["models/reverse-tiny.yaml"]:
        _self_test(p)
