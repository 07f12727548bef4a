"""A built model's library: DIR/lib<name>.so found in a `halformer build` output directory,
and opened through halformer._native so that a rebuilt file is loaded as the new version."""
import os
import pathlib
import threading

from . import _native


def _find_library(model_dir):
    """DIR/lib<name>.so of a `halformer build` output directory (or that .so itself)."""
    path = pathlib.Path(os.fspath(model_dir))
    if path.is_file() and path.suffix == ".so":
        return path
    if not path.exists():
        raise FileNotFoundError(f"model directory {str(path)!r}: no such directory (make one with halformer.build)")
    if not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is neither a model directory nor a model's lib<name>.so")
    libs = sorted(p for p in path.glob("lib*.so") if p.is_file())
    if not libs:
        raise FileNotFoundError(
            f"model directory {str(path)!r} has no lib<name>.so: is it a `halformer build` output directory? "
            "(rebuild the model with this halformer)")
    if len(libs) > 1:
        raise ValueError(f"model directory {str(path)!r} holds several model libraries "
                         f"({', '.join(p.name for p in libs)}): pass the path of one of them")
    return libs[0]


# glibc's dlopen() of a path it has loaded before returns that library, even when the
# file was rebuilt since (`halformer build` replaces it by rename): a rebuilt library is
# loaded from a private copy instead, so build() + Model() in one process see the new model.
_loaded = {}  # realpath -> {(inode, size, mtime): the path dlopen()ed for that version}
_loaded_lock = threading.Lock()
_copies_dir = None


def _loadable(library):
    global _copies_dir
    real = os.path.realpath(library)
    st = os.stat(real)
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _loaded_lock:
        versions = _loaded.setdefault(real, {})
        if version not in versions:
            path = real
            if versions:  # another version of this path is loaded
                import atexit
                import shutil
                import tempfile
                if _copies_dir is None:
                    _copies_dir = tempfile.mkdtemp(prefix="halformer-")
                    atexit.register(shutil.rmtree, _copies_dir, True)
                path = os.path.join(_copies_dir, f"{len(versions)}-{os.path.basename(real)}")
                shutil.copyfile(real, path)
            _native.open_library(path)  # ValueError if it is not a model library
            versions[version] = path
        return versions[version]
