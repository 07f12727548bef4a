"""T5's relative position buckets: runtime/weight_load.cpp's relative_position_bucket (through
relative_buckets_tool) against transformers' T5Attention._relative_position_bucket, for
every relative position in [-600, 600], both directions, and bucket / distance pairs from
T5's own (32 / 128) to small and large ones -- including the distances where the
logarithmic formula lands on whole numbers (the float32 rounding matters there).

    python tests/layers/check_relative_buckets.py TOOL
"""
import json
import subprocess
import sys

import torch
from transformers.models.t5.modeling_t5 import T5Attention

PAIRS = [(32, 128), (8, 10), (64, 256), (128, 512), (32, 64), (16, 100), (4, 3), (6, 7), (32, 1000)]
LOW, HIGH = -600, 600


def main(tool):
    jobs = [{"buckets": b, "distance": d, "bidirectional": bi, "from": LOW, "to": HIGH}
            for b, d in PAIRS for bi in (True, False)]
    r = subprocess.run([tool], input=json.dumps(jobs), capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)
    positions = torch.arange(LOW, HIGH + 1)
    bad = 0
    for job, row in zip(jobs, got):
        want = T5Attention._relative_position_bucket(positions, bidirectional=job["bidirectional"],
                                                     num_buckets=job["buckets"], max_distance=job["distance"]).tolist()
        diff = [(p, g, w) for p, g, w in zip(positions.tolist(), row, want) if g != w]
        label = f"buckets {job['buckets']}, distance {job['distance']}, {'bidirectional' if job['bidirectional'] else 'causal'}"
        if diff:
            bad += 1
            print(f"{label}: {len(diff)} positions differ, e.g. (r, halformer, transformers) {diff[:5]}")
        else:
            print(f"{label}: {len(row)} positions equal, buckets used {len(set(row))}")
    if bad:
        raise SystemExit(f"{bad} of {len(jobs)} settings differ from transformers")


if __name__ == "__main__":
    main(sys.argv[1])
