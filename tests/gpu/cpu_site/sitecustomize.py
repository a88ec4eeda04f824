# On PYTHONPATH with UPCYCLE_CUDA_PATHS_ON_CPU=1 (tests/gpu on a machine without CUDA): every
# Python process of the sweep under test, Ray workers included, takes the CUDA code paths. The
# patches land when the patched modules are imported (tests/gpu/cuda_paths.py), so processes
# that never import the project pay nothing.
import os

if os.environ.get("UPCYCLE_CUDA_PATHS_ON_CPU") == "1":
    import importlib.abc
    import importlib.util
    import sys
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location(
        "_upcycle_cuda_paths", Path(__file__).resolve().parents[1] / "cuda_paths.py")
    _paths = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_paths)

    class _PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in _paths.PATCHES:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _paths.apply(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchOnImport())
