"""Tiny ONNX models built with onnx.helper (no PyTorch), for the model registry's tests."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


def tiny_model(scale: float = 2.0, *, initializer_as_input: bool = False) -> bytes:
    """y = x * scale + 1 on FP32 [batch, 3], with an INT64 input `ids` [batch] passed through, and a BOOL
    output: a model with a dynamic dimension, several datatypes and an initializer."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    ids_out = helper.make_tensor_value_info("ids_out", TensorProto.INT64, ["batch"])
    positive = helper.make_tensor_value_info("positive", TensorProto.BOOL, ["batch", 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1], [scale])
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "one"], ["y"]),
        helper.make_node("Identity", ["ids"], ["ids_out"]),
        helper.make_node("Greater", ["y", "zero"], ["positive"]),
    ]
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    inputs = [x, ids]
    if initializer_as_input:  # as exporters for IR version < 4 did
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [1]))
    graph = helper.make_graph(nodes, "tiny", inputs, [y, ids_out, positive], initializer=[w, one, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()
