"""Loading ONNX models: the signature read from the session, the checksum, the provider, broken artifacts."""

from __future__ import annotations

import hashlib

import numpy as np
import onnxruntime
import pytest

from gpuyard.services.serving.errors import BadRequest, ModelLoadError
from gpuyard.services.serving.protocol import DATATYPES
from gpuyard.services.serving.runtime import CPU, CUDA, ORT_TYPES, check_inputs, load_onnx

from .models import BROKEN, Mlp, half_to_double, text_echo, two_by_two


def test_every_protocol_datatype_has_an_onnx_runtime_type():
    assert set(ORT_TYPES.values()) == set(DATATYPES)


def test_the_signature_comes_from_the_graph(tmp_path):
    path = tmp_path / "two.onnx"
    path.write_bytes(two_by_two())
    model = load_onnx(path)
    assert [(s.name, s.datatype, s.shape) for s in model.inputs.values()] == [
        ("a", "INT64", (-1, 3)),
        ("mask", "BOOL", (-1, 3)),
    ]
    assert [(s.name, s.datatype, s.shape) for s in model.outputs.values()] == [
        ("kept", "INT64", (-1, 3)),
        ("flipped", "BOOL", (-1, 3)),
    ]
    assert model.batchable and model.provider == CPU
    assert model.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_fixed_first_dimension_is_not_batchable():
    model = load_onnx(Mlp(batch=2).bytes)
    assert model.inputs["x"].shape == (2, 4) and not model.batchable


def test_run_matches_numpy_and_counts_its_runs():
    mlp = Mlp()
    model = load_onnx(mlp.bytes)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(model.run({"x": x})["y"], mlp(x), rtol=1e-5, atol=1e-5)
    assert model.runs == 1


def test_bytes_reach_a_string_tensor_as_text():
    model = load_onnx(text_echo())
    out = model.run({"text": np.array([b"a", "\u00e9".encode()], dtype=object)})["same"]
    assert out.tolist() == ["a", "\u00e9"]
    with pytest.raises(BadRequest, match="UTF-8"):
        model.run({"text": np.array([b"\xff"], dtype=object)})


def test_a_checksum_mismatch_is_refused_before_loading(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(Mlp().bytes)
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_onnx(path, sha256=good.upper()).sha256 == good
    with pytest.raises(
        ModelLoadError, match=f"sha256 mismatch: expected {'0' * 64}, the artifact has {good}"
    ):
        load_onnx(path, sha256="0" * 64)


def test_broken_or_missing_artifacts_say_why(tmp_path):
    with pytest.raises(ModelLoadError, match="ONNX Runtime cannot load the model"):
        load_onnx(BROKEN)
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_onnx(tmp_path / "absent.onnx")


def test_session_options_and_the_provider_actually_used():
    model = load_onnx(Mlp().bytes, gpu=0, intra_op_threads=2)
    options = model.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    expected = CUDA if CUDA in onnxruntime.get_available_providers() else CPU
    assert model.provider == expected == model.session.get_providers()[0]
    assert load_onnx(Mlp().bytes).provider == CPU  # no GPU given


def test_check_inputs_names_the_wrong_name_datatype_or_shape():
    model = load_onnx(two_by_two())
    a, mask = np.zeros((2, 3), np.int64), np.zeros((2, 3), bool)
    check_inputs(model, {"a": a, "mask": mask}, {"a": "INT64", "mask": "BOOL"})
    cases = [
        ({"a": a, "maks": mask}, {"a": "INT64", "maks": "BOOL"}, "unknown input 'maks'"),
        (
            {"a": a.astype(np.int32), "mask": mask},
            {"a": "INT32", "mask": "BOOL"},
            "'a' is INT32, the model takes INT64",
        ),
        ({"a": np.zeros((2, 4), np.int64), "mask": mask}, {"a": "INT64", "mask": "BOOL"}, r"shape \[2, 4\]"),
        ({"a": np.zeros(3, np.int64), "mask": mask}, {"a": "INT64", "mask": "BOOL"}, r"shape \[3\]"),
        ({"a": a}, {"a": "INT64"}, "missing input 'mask'"),
    ]
    for given, datatypes, reason in cases:
        with pytest.raises(BadRequest, match=reason):
            check_inputs(model, given, datatypes)


def test_fp16_in_fp64_out():
    model = load_onnx(half_to_double())
    h = np.array([[0.5, -2.0], [1e-3, 65504]], dtype=np.float16)
    out = model.run({"h": h})["d"]
    assert out.dtype == np.float64 and np.array_equal(out, h.astype(np.float64))
