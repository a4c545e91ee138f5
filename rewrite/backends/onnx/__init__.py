"""The ONNX backend: `.onnx` files and `onnx.ModelProto`s.

One place, by concern:

- `adapter`: `OnnxAdapter`, the engine's view of a raw protobuf model: building the index, answering questions;
- `editing`: the adapter's edits (build, replace, remove) and writing the index back into the protobuf;
- `graph`: the index itself (`Value`, `Node`, `Graph`), its use lists, and where a node sits, for messages;
- `schema`: the op schemas: signatures, input positions, which ops are pure, broadcast or nest graphs;
- `tensors`: dtype names, and reading initializers and Constant values;
- `shapes`: symbolic shape inference, driving `shape_rules` (each op's shapes), `shape_contents` (values
  used as shapes), `dim_algebra` (arithmetic on symbolic dims), `onnx_inference` (onnx's own, for the
  other ops) and `node_inputs` (what they read off a node);
- `folding`: constant folding and pruning;
- `files`: reading and writing `.onnx` files, external data left on disk;
- `validation`: checking a written model with onnx's checker;
- `examples`: models built from rule examples, and their evaluation.

The names below are the backend's public API.
"""

from rewrite.backends.onnx.adapter import OnnxAdapter
from rewrite.backends.onnx.examples import (
    EXAMPLE_FACTS,
    build_example,
    copy_program,
    evaluate_example,
    validate_example,
)
from rewrite.backends.onnx.files import load_onnx, save_onnx
from rewrite.backends.onnx.graph import Graph, Node, OnnxError, Value
from rewrite.backends.onnx.schema import DIALECT, SCHEMA, OnnxSchema, count_nodes

__all__ = [
    "DIALECT", "EXAMPLE_FACTS", "SCHEMA", "Graph", "Node", "OnnxAdapter", "OnnxError", "OnnxSchema", "Value",
    "build_example",
    "copy_program", "count_nodes", "evaluate_example", "load_onnx", "save_onnx", "validate_example",
]
