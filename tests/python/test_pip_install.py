"""`pip install ./python` (scikit-build-core: builds the runtime and _native from source)
into a temporary target, then that copy -- not build/python -- imports and runs
reverse-tiny with its own libhalformer_rt.so. Slow (a fresh CMake build): label slow.
--no-build-isolation: scikit-build-core and nanobind come from the project's .venv
(tools/bootstrap.sh), so the test needs no network."""
import os
import subprocess
import sys
import textwrap

from conftest import SOURCE


def test_pip_install_and_run(reverse_tiny, tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--target", str(target), str(SOURCE / "python")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    pkg = target / "halformer"
    assert (pkg / "libhalformer_rt.so").is_file()
    script = textwrap.dedent(f"""
        import halformer
        m = halformer.Model({str(reverse_tiny.dir)!r}, weights={reverse_tiny.weights!r})
        print(halformer.__file__)
        print(m.generate([[3, 7, 1, 9]]))
        print(sorted({{l.split()[-1] for l in open('/proc/self/maps') if 'libhalformer_rt' in l}}))
        from halformer import _build_info
        print(_build_info.HALFORMER_TOOL)
    """)
    r = subprocess.run([sys.executable, "-c", script], env=dict(env, PYTHONPATH=str(target)), capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    file, tokens, runtimes, tool = r.stdout.splitlines()
    assert file == str(pkg / "__init__.py")
    assert tokens == "[[9, 1, 7, 3, 15]]"
    assert runtimes == repr([str(pkg / "libhalformer_rt.so")])  # its own runtime, loaded once
    assert os.path.realpath(tool) == os.path.realpath(SOURCE / "build" / "bin" / "halformer")
