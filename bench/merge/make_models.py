"""Builds the AlexNet- and ResNet-50-shaped ONNX models of `advm bench merge` from
seeded weights (the UPM paper's two functions, same parameter counts), and converts a
real model shipped in a PyPI package (rapidocr-onnxruntime's PP-OCR recognizer) the
same way: graph in NAME.onnx, weights in NAME.weights (each tensor page-aligned), and
their layout in NAME.json. Usage: make_models.py OUT_DIR"""

import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PAGE = os.sysconf("SC_PAGE_SIZE")


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.weights, self.n = [], {}, 0

    def name(self, p):
        self.n += 1
        return f"{p}{self.n}"

    def w(self, shape, fan_in):
        n = self.name("w")
        self.weights[n] = (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        return n

    def conv(self, x, cin, cout, k, stride=1, pad=0, relu=True):
        w, b, y = self.w((cout, cin, k, k), cin * k * k), self.w((cout,), cout), self.name("c")
        self.nodes.append(helper.make_node("Conv", [x, w, b], [y], kernel_shape=[k, k], strides=[stride] * 2, pads=[pad] * 4))
        return self.relu(y) if relu else y

    def relu(self, x):
        y = self.name("r")
        self.nodes.append(helper.make_node("Relu", [x], [y]))
        return y

    def op(self, kind, inputs, **attrs):
        y = self.name(kind.lower())
        self.nodes.append(helper.make_node(kind, inputs, [y], **attrs))
        return y

    def fc(self, x, cin, cout, relu=True):
        w, b = self.w((cout, cin), cin), self.w((cout,), cout)
        y = self.op("Gemm", [x, w, b], transB=1)
        return self.relu(y) if relu else y

    def model(self, x, y, out_shape):
        g = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, out_shape)],
        )
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), self.weights


def alexnet():
    b = Builder(1)
    x = b.conv("x", 3, 64, 11, 4, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    x = b.conv(x, 64, 192, 5, 1, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    x = b.conv(x, 192, 384, 3, 1, 1)
    x = b.conv(x, 384, 256, 3, 1, 1)
    x = b.conv(x, 256, 256, 3, 1, 1)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])
    x = b.op("Flatten", [x])
    x = b.fc(x, 9216, 4096)
    x = b.fc(x, 4096, 4096)
    x = b.fc(x, 4096, 1000, relu=False)
    return b.model("x", x, [1, 1000])


def resnet50():
    b = Builder(2)
    x = b.conv("x", 3, 64, 7, 2, 3)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            s = stride if i == 0 else 1
            y = b.conv(x, cin, width, 1)
            y = b.conv(y, width, width, 3, s, 1)
            y = b.conv(y, width, width * 4, 1, relu=False)
            short = b.conv(x, cin, width * 4, 1, s, relu=False) if i == 0 else x
            x = b.relu(b.op("Add", [y, short]))
            cin = width * 4
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x])
    x = b.fc(x, 2048, 1000, relu=False)
    return b.model("x", x, [1, 1000])


def shipped_ocr():
    """rapidocr-onnxruntime's PP-OCR recognition model, its initializers taken out."""
    import rapidocr_onnxruntime

    d = os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), "models")
    path = max((os.path.join(d, f) for f in os.listdir(d) if f.endswith(".onnx")), key=os.path.getsize)
    m = onnx.load(path)
    weights = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    del m.graph.initializer[:]
    # Its weights may also sit in Constant nodes: the large ones become weights too.
    keep = []
    for n in m.graph.node:
        value = [a for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]
        if n.op_type == "Constant" and value and np.prod(value[0].t.dims) >= 1024:
            weights[n.output[0]] = numpy_helper.to_array(value[0].t)
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m, weights, os.path.basename(path)


def save(out, name, model, weights, source):
    layout, off = [], 0
    with open(os.path.join(out, name + ".weights"), "wb") as f:
        for k, a in weights.items():
            a = np.ascontiguousarray(a)
            off = (off + PAGE - 1) // PAGE * PAGE
            f.seek(off)
            f.write(a.tobytes())
            layout.append({"name": k, "offset": off, "dtype": str(a.dtype), "shape": list(a.shape)})
            off += a.nbytes
    for t in layout:
        model.graph.input.append(
            helper.make_tensor_value_info(t["name"], helper.np_dtype_to_tensor_dtype(np.dtype(t["dtype"])), t["shape"])
        )
    onnx.save(model, os.path.join(out, name + ".onnx"))
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump({"tensors": layout, "bytes": off, "source": source, "input": input_of(model)}, f)


def input_of(model):
    i = model.graph.input[0]
    dims = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
    return {"name": i.name, "shape": dims}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    m, w = alexnet()
    save(out, "alexnet", m, w, "AlexNet-shaped, seeded weights (onnx.helper)")
    m, w = resnet50()
    save(out, "resnet50", m, w, "ResNet-50-shaped, seeded weights (onnx.helper)")
    m, w, src = shipped_ocr()
    save(out, "ppocr-rec", m, w, f"rapidocr-onnxruntime {src}")


if __name__ == "__main__":
    main()
