"""The ONNX backend: `.onnx` files and `onnx.ModelProto`s.

One place, by concern:

- `adapter`: `OnnxAdapter`, the engine's view of a raw protobuf model with a use index, and the op schema;
- `shapes`: symbolic shape inference, value-as-shape included;
- `files`: reading and writing `.onnx` files, external data left on disk;
- `examples`: models built from rule examples, and their evaluation.

The names below are the backend's public API.
"""

from rewrite.backends.onnx.adapter import (
    DIALECT,
    SCHEMA,
    Graph,
    Node,
    OnnxAdapter,
    OnnxError,
    OnnxSchema,
    Value,
    count_nodes,
    load_onnx,
    save_onnx,
)
from rewrite.backends.onnx.examples import EXAMPLE_FACTS, build_example, copy_program, evaluate_example, validate_example

__all__ = [
    "DIALECT", "EXAMPLE_FACTS", "SCHEMA", "Graph", "Node", "OnnxAdapter", "OnnxError", "OnnxSchema", "Value", "build_example",
    "copy_program", "count_nodes", "evaluate_example", "load_onnx", "save_onnx", "validate_example",
]
