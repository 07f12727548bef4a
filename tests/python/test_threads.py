"""Two different models (reverse-tiny, gpt-tiny) loaded into one Python process, called
from 4 Python threads at once (the GIL is released while kernels run): every result is
bit-identical to the same call made alone."""
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from test_models import GPT_SRC, REVERSE_SRC, REVERSE_TGT


def key(result):
    """A comparable, bit-exact form of a result (numpy arrays by their bytes)."""
    if isinstance(result, np.ndarray):
        return (result.shape, result.dtype.str, result.tobytes())
    return repr(result)


def test_two_models_four_threads(reverse_tiny, gpt_tiny):
    rev, gpt = reverse_tiny.model(), gpt_tiny.model(threads=2)
    sample = dict(max_new_tokens=10, sampling_topk=0, sampling_temperature=1.2, seed=99)
    jobs = [
        lambda: rev.generate(REVERSE_SRC),
        lambda: rev.generate([REVERSE_SRC[1]]),
        lambda: rev.generate(REVERSE_SRC, beam_size=3, return_scores=True),
        lambda: rev.encode(REVERSE_SRC),
        lambda: rev.score(REVERSE_SRC, REVERSE_TGT),
        lambda: rev.generate(REVERSE_SRC, sampling_topk=5, seed=3, return_scores=True),
        lambda: gpt.generate(GPT_SRC, max_new_tokens=12),
        lambda: gpt.generate(GPT_SRC, **sample),
        lambda: gpt.score(GPT_SRC),
        lambda: [t for t in gpt.generate_iter(GPT_SRC[:2], **sample)],
    ]
    alone = [key(job()) for job in jobs]
    calls = [i for i in range(len(jobs)) for _ in range(12)]
    random.Random(7).shuffle(calls)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: (i, key(jobs[i]())), calls))
    differ = [i for i, r in results if r != alone[i]]
    assert len(results) == 120 and not differ, f"{len(differ)} of {len(results)} calls differ: jobs {sorted(set(differ))}"
