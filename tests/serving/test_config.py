"""A bad configuration is a clear error before the server starts (exit code 2)."""
import os
import socket
import subprocess
import sys

import pytest

from conftest import MINILM_DIR, REVERSE_DIR, REVERSE_WEIGHTS, free_ports, minilm_files


def run(tmp_path, text, *args, timeout=120):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(text)
    ports = free_ports(3)
    p = subprocess.run([sys.executable, "-m", "halformer.serve", str(cfg), "--http-port", str(ports[0]),
                        "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), *args],
                       capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return p.returncode, p.stdout + p.stderr


def model(**kw):
    m = dict(name="reverse", kind="generate", model_dir=REVERSE_DIR, weights=REVERSE_WEIGHTS, threads=1)
    m.update(kw)
    return "  - {" + ", ".join(f"{k}: {v}" for k, v in m.items() if v is not None) + "}\n"


CASES = [
    ("unknown_kind", "models:\n" + model(kind="classify"), ["unknown kind 'classify'", "generate, generate_stream, embed_text, pooled"]),
    ("batching_on_stream", "models:\n" + model(kind="generate_stream", max_batch_size=4), ["unknown key(s) ['max_batch_size']", "generate_stream"]),
    ("missing_weights", "models:\n" + model(weights="/nonexistent/w.safetensors"), ["weights", "/nonexistent/w.safetensors", "does not exist"]),
    ("missing_model_dir", "models:\n" + model(model_dir="/nonexistent/dir"), ["model_dir", "is not a directory"]),
    ("no_weights_key", "models:\n" + model(weights=None), ["missing weights"]),
    ("duplicate_names", "models:\n" + model() + model(), ["'reverse': duplicate name"]),
    ("batch_zero", "models:\n" + model(max_batch_size=0), ["max_batch_size 0 is outside [1, 1024]"]),
    ("batch_not_int", "models:\n" + model(max_batch_size="lots"), ["max_batch_size must be an integer", "lots"]),
    ("negative_delay", "models:\n" + model(max_queue_delay_microseconds=-5), ["max_queue_delay_microseconds -5 is outside"]),
    ("threads_float", "models:\n" + model(threads=1.5), ["threads must be an integer"]),
    ("instances_zero", "models:\n" + model(instances=0), ["instances 0 is outside [1, 64]"]),
    ("bad_name", "models:\n" + model(name="'a b'"), ["name must match"]),
    ("unknown_key", "models:\n" + model(batch=4), ["unknown key(s) ['batch']"]),
    ("vocab_on_generate", "models:\n" + model(vocab=REVERSE_WEIGHTS), ["unknown key(s) ['vocab']"]),
    ("no_models", "models: []\n", ["models must be a non-empty list"]),
    ("not_yaml", "models: [unclosed\n", ["not valid YAML"]),
    ("bad_port", "server: {http_port: 70000}\nmodels:\n" + model(), ["http_port 70000 is outside"]),
    ("wrong_kind_for_model", "models:\n" + model(kind="pooled"), ["kind pooled needs an encoder-only model", "encoder_decoder"]),
]


@pytest.mark.parametrize("name,text,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_config(tmp_path, name, text, fragments):
    code, out = run(tmp_path, text)
    assert code == 2, out
    assert "halformer.serve: error:" in out, out
    for f in fragments:
        assert f in out, (f, out)
    assert "Started HTTPService" not in out  # no server was started


def test_missing_config_file(tmp_path):
    p = subprocess.run([sys.executable, "-m", "halformer.serve", str(tmp_path / "nope.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "nope.yaml: no such file" in p.stderr, p.stderr


def test_embed_text_needs_vocab_and_check_ok(tmp_path):
    w, v = minilm_files()
    code, out = run(tmp_path, f"models:\n  - {{name: m, kind: embed_text, model_dir: {MINILM_DIR}, weights: {w}}}\n")
    assert code == 2 and "missing vocab" in out, out
    code, out = run(tmp_path, f"models:\n  - {{name: m, kind: embed_text, model_dir: {MINILM_DIR}, weights: {w}, "
                              f"vocab: {v}, threads: 1}}\n" + model(), "--check")
    assert code == 0 and "ok (2 models)" in out, out


def test_port_in_use(tmp_path):
    """A port another process listens on is named at once (pytriton would time out after a
    minute, and tritonserver not say why)."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("models:\n" + model())
    http, grpc, metrics = free_ports(3)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", grpc))
        busy.listen()
        p = subprocess.run([sys.executable, "-m", "halformer.serve", str(cfg), "--http-port", str(http),
                            "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2 and f"grpc port {grpc} is in use" in p.stderr, p.stdout + p.stderr
