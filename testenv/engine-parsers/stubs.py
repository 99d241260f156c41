"""Stand-ins for the heavy modules (torch and its kin) that vLLM's and SGLang's argument
parsers import but never call: installed as the first meta-path finder, each listed
top-level name and its submodules import as a module whose every attribute is a class
that can be subclassed, called, used as a decorator, indexed or put in a union, and
whose calls return a falsy nothing. Only the listed names are stubbed: any other missing
module fails the import loudly. `torch` reports a ROCm build with 8 GPUs and Triton a
HIP gfx950 target, as on an MI355X node, so platform detection takes the ROCm branch.
"""

import abc
import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
import types
import typing

VERSIONS = {"torch": "2.11.0", "triton": "3.5.0", "torchvision": "0.26.0", "torchaudio": "2.11.0"}
ABSENT = object()  # an override meaning "no such attribute" (hasattr() is False)


class _Meta(abc.ABCMeta):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        sub = _stub_class(f"{cls.__qualname__}.{name}", cls.__module__)
        type.__setattr__(cls, name, sub)
        return sub

    def __call__(cls, *args, **kwargs):
        if not cls.__dict__.get("_stub", False):  # a real subclass written by the engine
            return type.__call__(cls, *args, **kwargs)
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # a bare decorator
        return _Nothing()

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return typing.Union[cls, other]

    def __ror__(cls, other):
        return typing.Union[other, cls]

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __bool__(cls):
        return True

    def __int__(cls):
        return 0

    __index__ = __int__

    def __float__(cls):
        return 0.0

    def __contains__(cls, item):
        return False


def _stub_class(qualname, module):
    c = _Meta(qualname.rsplit(".", 1)[-1], (), {"_stub": True, "__module__": module})
    c.__qualname__ = qualname
    return c


class _Nothing:
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Nothing()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Nothing()

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __int__(self):
        return 0

    __index__ = __int__

    def __float__(self):
        return 0.0

    def __str__(self):
        return ""

    def __add__(self, other):
        return other if isinstance(other, str) else self

    __radd__ = __add__

    def __eq__(self, other):
        return isinstance(other, _Nothing)

    def __hash__(self):
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getitem__(self, item):
        return _Nothing()

    def __setitem__(self, key, value):
        pass

    def __contains__(self, item):
        return False


def _infer_schema(fn, mutates_args=(), **kwargs):
    """torch.library.infer_schema's shape: engines' op registries split and compare it."""
    sig = inspect.signature(fn)
    params = ", ".join(
        f"Tensor {'(a!) ' if p in mutates_args else ''}{p}" for p in sig.parameters
    )
    n = max(1, str(sig.return_annotation).count("Tensor"))
    ret = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    return f"({params}) -> {ret}"


class _Library:
    """torch.library.Library: registrations accepted and dropped."""

    def __init__(self, ns, *args, **kwargs):
        self.ns = ns
        self.m = types.SimpleNamespace(name=ns)

    def __getattr__(self, name):
        return lambda *a, **k: None


OVERRIDES = {
    "torch": {n: ABSENT for n in ("npu", "hpu", "musa", "mlu", "xpu")},
    "torch.version": {
        "hip": "7.2.26015",
        "cuda": None,
        "musa": None,
        "__version__": VERSIONS["torch"],
        "git_version": "0" * 40,
    },
    "torch.cuda": {"is_available": lambda: True, "device_count": lambda: 8},
    "torch.library": {"infer_schema": _infer_schema, "Library": _Library},
    # Triton's view of the device: HIP on an MI355X (gfx950).
    "triton.runtime": {
        "driver": types.SimpleNamespace(
            active=types.SimpleNamespace(
                get_current_target=lambda: types.SimpleNamespace(
                    backend="hip", arch="gfx950", warp_size=64
                )
            )
        )
    },
}


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if OVERRIDES.get(self.__name__, {}).get(name) is ABSENT:
            raise AttributeError(name)
        if f"{self.__name__}.{name}" in OVERRIDES:
            # torch.version, torch.cuda: the submodule with its real-looking values.
            value = importlib.import_module(f"{self.__name__}.{name}")
            setattr(self, name, value)
            return value
        value = _stub_class(name, self.__name__)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        if "." not in spec.name:
            m.__version__ = VERSIONS.get(spec.name, "0.0.0")
        for k, v in OVERRIDES.get(spec.name, {}).items():
            if v is not ABSENT:
                setattr(m, k, v)
        return m

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def install(names):
    sys.meta_path.insert(0, _Finder(names))
