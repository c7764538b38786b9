"""What crosses from a sandboxed check run to the grader: plain data as JSON, never a pickle.

The grader's process judges what the student's code produced in the sandbox; it must not run any
of that code, so it reads the sandbox's output as JSON and rebuilds only these types:

    None, bool, int, float (inf and nan included), str, list, dict with str keys,
    a tensor: {"__tensor__": dtype, "shape": [...], "data": [...] (flat, row-major)}

Unpickling (``pickle``, ``cloudpickle``, ``torch.load`` without ``weights_only``) would run code
the submission chose; a JSON document can only ever be data. Tuples become lists. Sizes are
bounded (:data:`MAX_BYTES` per document, :data:`MAX_DEPTH`), so a submission cannot make the
grader run out of memory by printing a huge answer.
"""
from __future__ import annotations

import json
import math

MAX_BYTES = 64 * 2**20        # one document (one check case's data)
MAX_DEPTH = 32
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")


class WireError(ValueError):
    """The data is not of the shapes and types this protocol carries."""


def encode(obj, _depth: int = 0):
    """``obj`` as JSON-ready plain data (tensors flattened, tuples as lists)."""
    if _depth > MAX_DEPTH:
        raise WireError(f"data nested deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise WireError(f"dict keys must be str, got {sorted({type(k).__name__ for k in obj})}")
        return {k: encode(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v, _depth + 1) for v in obj]
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        if t.is_complex() or str(t.dtype).removeprefix("torch.") not in DTYPES:
            raise WireError(f"tensor dtype {t.dtype} is not carried")
        flat = t.reshape(-1).to(torch.float64 if t.is_floating_point() else t.dtype).tolist()
        return {"__tensor__": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": flat}
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "shape", None) == ():
        return encode(obj.item(), _depth)                   # a numpy scalar
    raise WireError(f"{type(obj).__name__} is not carried (plain data and tensors only)")


def dumps(obj) -> str:
    text = json.dumps(encode(obj), allow_nan=True, separators=(",", ":"))
    if len(text) > MAX_BYTES:
        raise WireError(f"{len(text)} bytes of data, more than {MAX_BYTES}")
    return text


def decode(obj, _depth: int = 0):
    """The plain data of :func:`encode`, with tensors rebuilt; anything else is a :class:`WireError`."""
    if _depth > MAX_DEPTH:
        raise WireError(f"data nested deeper than {MAX_DEPTH}")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode(v, _depth + 1) for v in obj]
    if not isinstance(obj, dict):
        raise WireError(f"unexpected {type(obj).__name__}")
    if "__tensor__" not in obj:
        return {str(k): decode(v, _depth + 1) for k, v in obj.items()}
    import torch
    dtype, shape, data = obj.get("__tensor__"), obj.get("shape"), obj.get("data")
    if dtype not in DTYPES or set(obj) != {"__tensor__", "shape", "data"}:
        raise WireError(f"bad tensor record (dtype {dtype!r}, keys {sorted(obj)})")
    if not (isinstance(shape, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                            for s in shape)):
        raise WireError(f"bad tensor shape {shape!r}")
    if not isinstance(data, list) or len(data) != math.prod(shape):
        raise WireError(f"tensor data of {len(data) if isinstance(data, list) else '?'} elements for shape {shape}")
    if not all(isinstance(v, (int, float)) for v in data):
        raise WireError("tensor data must be numbers")
    want = getattr(torch, dtype)
    work = torch.float64 if want.is_floating_point else (torch.bool if want == torch.bool else torch.int64)
    return torch.tensor(data, dtype=work).reshape(shape).to(want)


def loads(text: str):
    if len(text) > MAX_BYTES:
        raise WireError(f"{len(text)} bytes of data, more than {MAX_BYTES}")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise WireError(f"not JSON: {e}") from None
    return decode(raw)
