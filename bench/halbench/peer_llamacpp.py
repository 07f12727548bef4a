"""llama.cpp (llama-cpp-python) on a GGUF file, in its own process (the peer protocol of
halbench/common.py; needs only numpy and llama_cpp, so it runs in whichever venv has them).

    python -m halbench.peer_llamacpp TASK.json RESULT.json

TASK: {"model": PATH, "threads": 2, "rounds": 3, "prompt_len": 512, "new_tokens": 128,
       "context": 4096 (0: skip), "prompt": [ids], "check_prompts": [[ids]...], "check_new": 32}
RESULT: {"system": "llama.cpp", "status": "ok" | "error", "versions": {...},
         "prompt_ms": [per round], "decode_ms": [per round: mean ms per token],
         "context_decode_ms": [...], "context_prompt_ms": [...], "max_rss_bytes": N,
         "checks": [{"prompt": [...], "greedy": [...], "last_logits": [...]}]}

Timing: a prompt is evaluated as llama.cpp's own `llama-bench` does (one llama_decode of
n_batch >= the prompt); decode is greedy, one token per llama_decode (argmax of the last
logits), the mean over `new_tokens` after the prompt.
"""
from __future__ import annotations

import json
import resource
import sys
import time


def request_amx_tile_state() -> None:
    """Asks Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA), as
    halformer's runtime does: llama-cpp-python 0.3.36's ggml runs tileloadd on Q8_0 files
    without asking first, and the process dies of SIGILL (seen on Sapphire Rapids). A no-op
    where the CPU or kernel has no AMX."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(158, 0x1023, 18)  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    except (OSError, AttributeError):
        pass


def main(task_path: str, result_path: str) -> int:
    with open(task_path) as f:
        task = json.load(f)
    res = {"system": "llama.cpp", "status": "ok"}
    try:
        import numpy as np
        import llama_cpp

        request_amx_tile_state()
        if task.get("no_extra_buffers"):  # llama.cpp's weight repacking (AMX tiles here) off
            default_params = llama_cpp.llama_model_default_params

            def without_extra_buffers():
                p = default_params()
                p.use_extra_bufts = False
                return p

            llama_cpp.llama_model_default_params = without_extra_buffers
            import llama_cpp.llama as llama_module

            llama_module.llama_cpp.llama_model_default_params = without_extra_buffers
        res["versions"] = {"llama_cpp_python": llama_cpp.__version__}
        ctx = max(task["prompt_len"] + task["new_tokens"], task.get("context", 0) + 16, 512)
        llm = llama_cpp.Llama(model_path=task["model"], n_ctx=ctx, n_batch=max(512, task["prompt_len"]),
                              n_ubatch=max(512, task["prompt_len"]), n_threads=task["threads"],
                              n_threads_batch=task["threads"], logits_all=False, verbose=False)

        n_vocab = llm.n_vocab()

        def last_logits():  # the last evaluated token's (the only output row without logits_all)
            return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float32)

        def greedy(prompt, n):
            llm.reset()
            llm.eval(prompt)
            out, steps = [], []
            for _ in range(n):
                tok = int(np.argmax(last_logits()))
                out.append(tok)
                t0 = time.perf_counter()
                llm.eval([tok])
                steps.append((time.perf_counter() - t0) * 1e3)
            return out, steps

        prompt = task["prompt"][: task["prompt_len"]]
        res["prompt_ms"], res["decode_ms"], res["context_decode_ms"], res["context_prompt_ms"] = [], [], [], []
        for r in range(task["rounds"] + 1):  # round 0 warms up
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompt)
            prompt_ms = (time.perf_counter() - t0) * 1e3
            _, steps = greedy(task["prompt"][:16], task["new_tokens"])
            if r:
                res["prompt_ms"].append(prompt_ms)
                res["decode_ms"].append(sum(steps) / len(steps))
        if task.get("context", 0) > 0:  # decode after a long context: 16 steps after `context` tokens
            long = (task["prompt"] * (task["context"] // len(task["prompt"]) + 1))[: task["context"]]
            for _ in range(2):
                llm.reset()
                t0 = time.perf_counter()
                llm.eval(long)
                res["context_prompt_ms"].append((time.perf_counter() - t0) * 1e3)
                steps = []
                for _ in range(16):
                    t0 = time.perf_counter()
                    llm.eval([int(np.argmax(last_logits()))])
                    steps.append((time.perf_counter() - t0) * 1e3)
                res["context_decode_ms"].append(sum(steps) / len(steps))
        res["checks"] = []
        for p in task.get("check_prompts", []):
            llm.reset()
            llm.eval(p)
            logits = last_logits()
            toks, _ = greedy(p, task.get("check_new", 32))
            res["checks"].append({"prompt": p, "greedy": toks, "last_logits": logits.tolist()})
        res["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception as e:  # reported, not raised: the harness goes on with the other rows
        res["status"], res["reason"] = "error", f"{type(e).__name__}: {e}"
    with open(result_path, "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
