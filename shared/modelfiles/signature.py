"""The signature of an ONNX model: its inputs and outputs, each with its name, its Open Inference Protocol
datatype and its shape (-1 for a dynamic dimension), read from the graph with the `onnx` package alone (no
ONNX Runtime: the submit service reads it when a model is published).

A file that is not a valid, self-contained ONNX model is refused with the reason (`InvalidModel`).

An uploaded file is checked in a process of its own (`check_file`), bounded in time and in memory: parsing and
checking a large or deeply nested graph is CPU work that would otherwise hold the API's event loop (and the
GIL), and a crafted file could make it use any amount of memory. Run as `python -m gpuyard.shared.modelfiles.signature PATH
MEMORY_BYTES`, this module is that process: it prints the signature, or why the file is refused, as JSON."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.contracts.events.models import TensorSpec
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.modelfiles.store import StagedFile

log = logging.getLogger(__name__)

# onnx.TensorProto.DataType -> the Open Inference Protocol's name (the numbers are the ONNX IR's, fixed)
V2_DATATYPE = {
    1: "FP32",  # FLOAT
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",  # STRING
    9: "BOOL",
    10: "FP16",  # FLOAT16
    11: "FP64",  # DOUBLE
    12: "UINT32",
    13: "UINT64",
    16: "BF16",  # BFLOAT16
}
OUT_OF_MEMORY = 3
"""The checking process's exit status when its memory bound was reached."""
NICENESS = 10
"""The checking process yields the CPU to the API's own (a host with few cores)."""


class InvalidModel(ValueError):
    """Not a model GPUYARD can publish; the message says why."""


@dataclass(frozen=True)
class Signature:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass(frozen=True)
class CheckBounds:
    """What the check of one uploaded file may take (the submit service's settings)."""

    seconds: float = 120.0
    memory_bytes: int = 4 << 30


def _tensor(value_info, role: str) -> TensorSpec:
    name = value_info.name
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise InvalidModel(f"{role} {name!r} is a {kind or 'value of no type'}, not a tensor")
    tensor = value_info.type.tensor_type
    datatype = V2_DATATYPE.get(tensor.elem_type)
    if datatype is None:
        raise InvalidModel(f"{role} {name!r} has an element type ({tensor.elem_type}) with no v2 datatype")
    if not tensor.HasField("shape"):
        raise InvalidModel(f"{role} {name!r} has no shape (its rank is unknown): export it with one")
    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim]
    return TensorSpec(name=name, datatype=datatype, shape=shape)


def read_signature(data: bytes | StagedFile) -> Signature:
    """The inputs (less the initializers, which older exporters list among them) and outputs of the ONNX
    model in `data`. Raises InvalidModel.

    Bytes are read here, in this process; a staged file is checked by `check_file` in a process of its own,
    with the default bounds, unless it was checked already (its `signature`)."""
    if isinstance(data, StagedFile):
        if data.signature is None:
            data.signature = check_file(data.path)
        return data.signature
    return _read(data)


def _read(data: bytes, path: Path | None = None) -> Signature:
    """`read_signature` in this process; with `path` (the file `data` was read from, for the checker, which
    then reads it itself: the parsed model is not copied once more to be checked)."""
    import onnx  # (a second's import: only when a model is read)
    from google.protobuf.message import DecodeError

    if not data:
        raise InvalidModel("the file is empty")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        if _out_of_memory(exc):
            raise MemoryError(str(exc)) from None
        raise InvalidModel(f"not an ONNX model: {exc or 'it cannot be parsed'}") from None
    del data
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InvalidModel("not an ONNX model: no IR version or no graph")
    graph = model.graph
    external = onnx.TensorProto.EXTERNAL
    if any(t.data_location == external for t in graph.initializer):
        raise InvalidModel("the model keeps tensors in external data files: publish a single-file model")
    initializers = {t.name for t in graph.initializer}
    try:  # (said after the checker's reason, which comes first)
        inputs = [_tensor(v, "input") for v in graph.input if v.name not in initializers]
        outputs = [_tensor(v, "output") for v in graph.output]
        problem = None if outputs else InvalidModel("the graph has no output")
    except InvalidModel as exc:
        problem = exc
    if path is not None:
        del model, graph  # (the checker parses the file again)
    try:
        onnx.checker.check_model(str(path) if path is not None else model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        if _out_of_memory(exc):
            raise MemoryError(str(exc)) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModel(f"not a valid ONNX model: {first}") from None
    if problem is not None:
        raise problem
    return Signature(inputs, outputs)


def _out_of_memory(exc: Exception) -> bool:
    """Whether a reader's error is an allocation refused (protobuf says 'Arena alloc failed', the checker
    'std::bad_alloc'): the memory bound's doing, not the file's."""
    return "alloc" in str(exc).lower()


# ---------------------------------------------------------------- the check in a process of its own


def check_file(path: Path | str, bounds: CheckBounds = CheckBounds()) -> Signature:
    """The signature of the ONNX file at `path`, read and checked in a child process that may run
    `bounds.seconds` and use `bounds.memory_bytes` of address space (RLIMIT_AS); InvalidModel when the file is
    not a valid model or its check goes past a bound, OSError when the check cannot be run (no process, or one
    that fails for a reason of its own). Blocks: `check_file_async` is the event loop's."""
    try:
        done = subprocess.run(
            _command(path, bounds),
            capture_output=True,
            env=_env(),
            timeout=bounds.seconds,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:  # (the child is killed)
        raise _took_too_long(bounds) from None
    return _answer(done, bounds)


async def check_file_async(path: Path | str, bounds: CheckBounds = CheckBounds()) -> Signature:
    """`check_file`, waiting for the child without holding a thread (a check may take minutes); the child is
    killed when the bound is reached or the caller cancelled."""
    command = _command(path, bounds)
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), bounds.seconds)
    except BaseException as exc:  # (the bound reached, or the caller gone)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.communicate()  # (its end, and its pipes', awaited: nothing is left open)
        if isinstance(exc, TimeoutError):
            raise _took_too_long(bounds) from None
        raise
    assert proc.returncode is not None
    return _answer(subprocess.CompletedProcess(command, proc.returncode, out, err), bounds)


def _command(path: Path | str, bounds: CheckBounds) -> list[str]:
    return [
        sys.executable,
        "-P",
        "-m",
        "gpuyard.shared.modelfiles.signature",
        str(path),
        str(bounds.memory_bytes),
    ]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")  # (less address space)
    root = str(Path(__file__).resolve().parents[2])  # where `shared` is, whatever the working directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _took_too_long(bounds: CheckBounds) -> InvalidModel:
    return InvalidModel(
        f"checking it took over {bounds.seconds:g} s (the limit): a graph this large or this deeply nested is "
        "not published"
    )


def _answer(done: subprocess.CompletedProcess, bounds: CheckBounds) -> Signature:
    """What the checking process said; InvalidModel for a file it refused or whose check went past a bound,
    OSError when it failed for a reason of its own (the file is not to blame)."""
    needs_more = (
        f"checking it needs more than {format_size(bounds.memory_bytes)} of memory (the limit): a graph this "
        "large or this deeply nested is not published"
    )
    if done.returncode == OUT_OF_MEMORY:
        raise InvalidModel(needs_more)
    if done.returncode < 0:  # (a native allocation refused, or its stack exhausted)
        name = signal.Signals(-done.returncode).name if -done.returncode in signal.valid_signals() else ""
        raise InvalidModel(
            f"its check was ended by signal {name or -done.returncode} (the limit: "
            f"{format_size(bounds.memory_bytes)} of memory): a graph this large or this deeply nested is not "
            "published"
        )
    said = None
    if done.returncode == 0:
        try:
            said = json.loads(done.stdout)
        except ValueError:
            said = None
    if not isinstance(said, dict):
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        if any("memory" in line.lower() for line in why[-5:]):  # (glibc: no memory for a thread, ...)
            raise InvalidModel(needs_more)
        log.warning("the model checker failed (status %s): %s", done.returncode, "\n".join(why[-20:]))
        raise OSError(
            f"the model checker failed (status {done.returncode}): {why[-1] if why else 'no output'}"
        )
    if "invalid" in said:
        raise InvalidModel(str(said["invalid"]))
    return Signature(
        [TensorSpec.model_validate(t) for t in said["inputs"]],
        [TensorSpec.model_validate(t) for t in said["outputs"]],
    )


def _child(path: str, memory_bytes: int) -> int:
    """The checking process: the libraries loaded, bound itself, read the file, answer on stdout."""
    import resource

    import onnx  # noqa: F401 (loaded before the bound, which is the model's)

    os.nice(NICENESS)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    try:
        try:
            signature = _read(Path(path).read_bytes(), Path(path))
        except InvalidModel as exc:
            answer: dict = {"invalid": str(exc)}
        except RecursionError:
            answer = {"invalid": "its graph is nested too deeply to be read"}
        except (MemoryError, OSError, ImportError):
            raise
        except Exception as exc:  # (the file made the reader fail: it is not a model it can read)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            answer = {"invalid": f"not an ONNX model: {type(exc).__name__}{': ' + first if first else ''}"}
        else:
            answer = {
                "inputs": [t.model_dump() for t in signature.inputs],
                "outputs": [t.model_dump() for t in signature.outputs],
            }
    except MemoryError:
        return OUT_OF_MEMORY
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], int(sys.argv[2])))
