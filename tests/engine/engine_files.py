"""trtexec-format reports (detailed layer information, profile) built from the demo export's node names;
shared by the engine tests (a plain module: `from conftest import` is ambiguous when several test
folders run in one pytest command)."""

INT8 = "Thirty-two wide channel vectorized row major Int8 format."
FP32 = "Row major linear FP32"
HALF = "Half"


def tensor(name, dims, fmt):
    return {"Name": name, "Location": "Device", "Dimensions": dims, "Format/Datatype": fmt}


def engine_layers(names):
    """The detailed layer information TensorRT 8.6 writes for the demo export, with planted problems:
    block.conv2 (+ the residual add) in FP32, fc's input Quantize left as a standalone Scale layer, and an
    INT8 -> FP32 Reformat in front of head_pool's GlobalAveragePool (which then runs in FP32)."""
    def n(name):
        assert name in names, f"the export has no node {name!r}: {names}"
        return name

    def layer(parts, layer_type, parameter_type, inputs, outputs, **extra):
        return {"Name": " + ".join(n(p) for p in parts), "LayerType": layer_type, "ParameterType": parameter_type,
                "Inputs": inputs, "Outputs": outputs, **extra}

    return [
        layer(["stem.0._input_quantizer/QuantizeLinear"], "Scale", "Scale",
              [tensor("input", [1, 1, 8, 8], FP32)], [tensor("q0", [1, 1, 8, 8], INT8)]),
        layer(["stem.0._weight_quantizer/QuantizeLinear", "stem.0/Conv", "stem.2/Relu"], "CaskConvolution",
              "Convolution", [tensor("q0", [1, 1, 8, 8], INT8)], [tensor("s", [1, 16, 8, 8], INT8)],
              OutMaps=16, TacticName="sm80_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32"),
        layer(["block.conv1._weight_quantizer/QuantizeLinear", "block.conv1/Conv", "block.relu/Relu"],
              "CaskConvolution", "Convolution", [tensor("s", [1, 16, 8, 8], INT8)],
              [tensor("c1", [1, 16, 8, 8], INT8)]),
        layer(["block.conv2._weight_quantizer/QuantizeLinear", "block.conv2/Conv", "block.add/Add",
               "block.relu/Relu_1"], "CaskConvolution", "Convolution",
              [tensor("c1f", [1, 16, 8, 8], FP32), tensor("s", [1, 16, 8, 8], FP32)],
              [tensor("b", [1, 16, 8, 8], FP32)]),
        layer(["pool/MaxPool"], "CaskPooling", "Pooling", [tensor("b", [1, 16, 8, 8], INT8)],
              [tensor("p", [1, 16, 4, 4], INT8)]),
        layer(["expand.0._weight_quantizer/QuantizeLinear", "expand.0/Conv", "expand.2/Relu"], "CaskConvolution",
              "Convolution", [tensor("p", [1, 16, 4, 4], INT8)], [tensor("e", [1, 32, 4, 4], INT8)]),
        {"Name": f"Reformatting CopyNode for Input Tensor 0 to {n('head_pool/GlobalAveragePool')}",
         "LayerType": "Reformat",
         "ParameterType": "Reformat", "Inputs": [tensor("e", [1, 32, 4, 4], INT8)],
         "Outputs": [tensor("ef", [1, 32, 4, 4], FP32)], "Origin": "REFORMAT"},
        layer(["head_pool/GlobalAveragePool"], "CaskReduce", "Reduce", [tensor("ef", [1, 32, 4, 4], FP32)],
              [tensor("m", [1, 32, 1, 1], FP32)]),
        layer(["/Flatten"], "NoOp", "Shuffle", [tensor("m", [1, 32, 1, 1], FP32)], [tensor("v", [1, 32], FP32)]),
        layer(["fc._input_quantizer/QuantizeLinear"], "Scale", "Scale", [tensor("v", [1, 32], FP32)],
              [tensor("vq", [1, 32], INT8)]),
        layer(["fc._weight_quantizer/QuantizeLinear", "fc/Gemm"], "CaskGemmMatrixMultiply", "MatrixMultiply",
              [tensor("vq", [1, 32], INT8)], [tensor("output", [1, 10], FP32)]),
    ]


def profile_for(layers, runs=100):
    """trtexec's --exportProfile list: {"count"} first, then one record per layer."""
    times = [0.010 + 0.001 * i for i in range(len(layers))]
    total = sum(times)
    records = [{"count": runs}]
    for layer, average in zip(layers, times):
        name = layer["Name"] if isinstance(layer, dict) else layer
        records.append({"name": name, "timeMs": average * runs, "averageMs": average, "medianMs": average,
                        "percentage": 100.0 * average / total})
    return records
