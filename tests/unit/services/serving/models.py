"""Small ONNX models built with onnx.helper (no torch), each with a numpy function computing what it should
answer, to check the server's outputs against."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model.SerializeToString()


class Mlp:
    """x [N, IN] FP32 -> relu(x @ w1 + b1) @ w2 + b2 -> y [N, OUT]; the batch dimension is dynamic unless
    `batch` fixes it."""

    def __init__(self, inputs=4, hidden=8, outputs=3, seed=0, batch: int | str = "N"):
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((inputs, hidden)).astype(np.float32)
        self.b1 = rng.standard_normal(hidden).astype(np.float32)
        self.w2 = rng.standard_normal((hidden, outputs)).astype(np.float32)
        self.b2 = rng.standard_normal(outputs).astype(np.float32)
        self.inputs = inputs
        self.bytes = _model(
            [
                helper.make_node("MatMul", ["x", "w1"], ["h0"]),
                helper.make_node("Add", ["h0", "b1"], ["h1"]),
                helper.make_node("Relu", ["h1"], ["h"]),
                helper.make_node("MatMul", ["h", "w2"], ["y0"]),
                helper.make_node("Add", ["y0", "b2"], ["y"]),
            ],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, inputs])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, outputs])],
            [
                numpy_helper.from_array(self.w1, "w1"),
                numpy_helper.from_array(self.b1, "b1"),
                numpy_helper.from_array(self.w2, "w2"),
                numpy_helper.from_array(self.b2, "b2"),
            ],
        )

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ self.w1 + self.b1, 0) @ self.w2 + self.b2


def two_by_two() -> bytes:
    """a INT64 [N, 3] and mask BOOL [N, 3] -> kept INT64 (a where mask, else 0) and flipped BOOL (not mask)."""
    zero = numpy_helper.from_array(np.array(0, dtype=np.int64), "zero")
    return _model(
        [
            helper.make_node("Where", ["mask", "a", "zero"], ["kept"]),
            helper.make_node("Not", ["mask"], ["flipped"]),
        ],
        [
            helper.make_tensor_value_info("a", TensorProto.INT64, ["N", 3]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", 3]),
        ],
        [
            helper.make_tensor_value_info("kept", TensorProto.INT64, ["N", 3]),
            helper.make_tensor_value_info("flipped", TensorProto.BOOL, ["N", 3]),
        ],
        [zero],
    )


def two_by_two_reference(a: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    return {"kept": np.where(mask, a, 0), "flipped": ~mask}


def text_echo() -> bytes:
    """text BYTES [N] -> same BYTES [N] (an ONNX string tensor through Identity)."""
    return _model(
        [helper.make_node("Identity", ["text"], ["same"])],
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["N"])],
    )


def half_to_double() -> bytes:
    """h FP16 [N, 2] -> d FP64 [N, 2] (Cast), for the datatypes without an exact JSON form."""
    return _model(
        [helper.make_node("Cast", ["h"], ["d"], to=TensorProto.DOUBLE)],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT16, ["N", 2])],
        [helper.make_tensor_value_info("d", TensorProto.DOUBLE, ["N", 2])],
    )


BROKEN = b"\x08\x07 this is not an ONNX model"


def doubler() -> bytes:
    """x FP32 [N, M] -> y = 2x [N, M]: both dimensions dynamic, to batch requests of several widths."""
    two = numpy_helper.from_array(np.array(2, dtype=np.float32), "two")
    return _model(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "M"])],
        [two],
    )


def unloadable() -> bytes:
    """A valid ONNX file (it passes the checker, so it publishes) that ONNX Runtime refuses: an operator of a
    domain no runtime has."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    node = helper.make_node("NoSuchOperator", ["x"], ["y"], domain="gpuyard.test")
    graph = helper.make_graph([node], "broken", [x], [y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("gpuyard.test", 1)]
    )
    model.ir_version = 9
    return model.SerializeToString()
