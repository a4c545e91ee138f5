"""The Core ML MIL backend: coremltools `Program`s and `.mlpackage` files.

One place, by concern:

- `adapter`: `MilAdapter`, the engine's view of a pymil program (navigation and values), and the op schema;
- `editing`: the adapter's edits (build, replace, remove) and the scopes new ops inherit;
- `shape_proofs`: what the adapter proves of shapes, shape values and dim bounds beyond coremltools' types;
- `shapes`: which ops broadcast, keep or compute shapes, and the dim arithmetic the proofs use;
- `bounds`: bounds on the elements of integer values;
- `vars`: a var's dims, dtype and operands in the engine's terms;
- `uses`: use lists that stay cheap to edit on values with thousands of consumers;
- `files`: `.mlpackage` loading and saving, input specs kept;
- `passes`: a rule set as a coremltools graph pass;
- `examples`: programs built from rule examples, and their semantic checks;
- `copying`: whole-program copies that do not recurse;
- `reference`: the evaluator that runs a program off macOS;
- `pymil`: coremltools, imported once.

The names below are the backend's public API.
"""

from rewrite.backends.mil.adapter import DIALECT, SCHEMA, MilAdapter, MilSchema
from rewrite.backends.mil.copying import copy_program
from rewrite.backends.mil.examples import (
    EXAMPLE_FACTS,
    SemanticProblem,
    build_example,
    evaluate_example,
    semantic_problems,
)
from rewrite.backends.mil.files import DEFAULT_UPPER_BOUND, MilSource, load_mlpackage, save_mlpackage
from rewrite.backends.mil.passes import register_graph_pass
from rewrite.backends.mil.pymil import Block, Function, MilError, Operation, Program, Var, count_ops, ct, mb, types

__all__ = [
    "DEFAULT_UPPER_BOUND", "DIALECT", "EXAMPLE_FACTS", "SCHEMA", "Block", "Function", "MilAdapter", "MilError",
    "MilSchema",
    "MilSource", "Operation", "Program", "SemanticProblem", "Var", "build_example", "copy_program", "count_ops",
    "ct", "evaluate_example", "load_mlpackage", "mb", "register_graph_pass", "save_mlpackage", "semantic_problems",
    "types",
]
