"""Editing a pymil program for the MIL adapter: building ops, replacing uses, removing ops.

Every edit goes through coremltools' own block API, so the result is a
normal pymil program that validates and serialises as any other; what this
adds is the bookkeeping a long run needs to stay linear (use lists, the
non-replaceable-var marks refreshed once in `finish`) and the scopes
coremltools records of where each op came from.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from typing import Any

from rewrite.backends.mil import shapes as mil_shapes
from rewrite.backends.mil.pymil import Block, Function, Operation, Var, block_module, mb
from rewrite.backends.mil.uses import MANY_USES, replace_uses_in_block, truncate_uses
from rewrite.backends.mil.vars import symbols_renamed, vars_in
from rewrite.engine.interfaces import TypeChangedError


@contextlib.contextmanager
def in_block(block: Block):
    """Make `block` the builder's current block, like `with block:` but cheap.

    Leaving a `with block:` walks every op of the block to refresh
    coremltools' non-replaceable-var marks; doing that per rewrite makes a
    run quadratic. `MilAdapter.finish` refreshes them once instead.
    """
    block_module.BLOCK_STACK.append(block)
    try:
        yield block
    finally:
        block_module.BLOCK_STACK.pop()



class MilEditing:
    """The edits of `MilAdapter`, the half of it that changes the program.

    A base class of `MilAdapter`, which sets up the state used here:
    `program`, `check_types`, `_names`, `_changed`, `_has_constexpr`,
    `_use_lists`, `_accepted_inputs`, `_uses_versions` and `_proofs`.
    """

    def _uses_changed(self, values) -> None:
        # What `uses_version` reads: bumped for each value an edit adds or drops a use of.
        versions = self._uses_versions
        for value in values:
            entry = versions.get(id(value))
            if entry is None:
                versions[id(value)] = [value, 1]
            else:
                entry[1] += 1

    def build(self, op_type: str, operands: dict[str, Any], before: Operation, name: str) -> Var:
        block = before.enclosing_block
        builder = getattr(mb, op_type)
        self._changed = True
        self._has_constexpr = self._has_constexpr or op_type.startswith("constexpr_")
        arguments = {k: mil_shapes.as_mil_constant(v) for k, v in operands.items() if v is not None}
        previous = _op_before(block, before)
        # What a builder that fails its own type checks leaves behind: the ops
        # it read as a consumer of their outputs, and consts it inserted.
        # (Their lengths, not copies: a value may feed every layer.)
        readers = {id(v): (v, len(v._child_ops)) for v in vars_in(arguments.values())}
        self._uses_changed(var for var, _ in readers.values())
        try:
            with in_block(block):
                result = builder(**arguments, before_op=before, name=self._unique_name(name))
        except Exception:
            # coremltools inserts an op before its type checks run: a failed
            # one sits in the block without outputs, which remove_ops needs.
            stranded = _ops_between(block, previous, before)
            for op in stranded:
                if op.outputs is None:
                    op._output_vars = []
            block.remove_ops(stranded)
            for var, length in readers.values():
                truncate_uses(var, length)
            raise
        # The new op and the consts the builder made for its constant operands
        # stand for `before`, the op the rule matched: they carry its scopes.
        inherit_scopes(_ops_between(block, previous, before), before, _rule_of(name))
        self._proofs.note_built(arguments.values(), result if isinstance(result, (list, tuple)) else (result,))
        return result[0] if isinstance(result, (list, tuple)) else result

    def _unique_name(self, name: str) -> str:
        # The engine's names are unique within one run; a second run over the
        # same program must not reuse a name still in it.
        if self._names is None:
            self._names = set()
            for function in self.program.functions.values():
                self._collect_names(function)
        candidate, serial = name, 0
        while candidate in self._names:
            serial += 1
            candidate = f"{name}_{serial}"
        self._names.add(candidate)
        return candidate

    def _collect_names(self, block: Block) -> None:
        for op in block.operations:
            self._names.add(op.name)
            self._names.update(v.name for v in op.outputs)
            for nested in op.blocks:
                self._collect_names(nested)

    def replace_all_uses(self, old: Var, new: Var) -> None:
        self._changed = True
        self._uses_changed((old, new))
        block = self.defining_block(old)
        # A function output is one of its function's consuming blocks: asked of
        # the value, not by listing every output of a model that has thousands.
        is_function_output = any(isinstance(b, Function) for b in old.consuming_blocks)
        if is_function_output:
            function_outputs = {id(v) for f in self.program.functions.values() for v in f.outputs}
            function_inputs = {id(v) for f in self.program.functions.values() for v in f.inputs.values()}
            if id(new) in function_inputs or id(new) in function_outputs:
                # A function output must keep its own name, and an input's or
                # another output's name cannot be given away: bridge with identity.
                previous = _op_before(block, old.op)
                with in_block(block):
                    new = mb.identity(x=new, before_op=old.op, name=old.name + "_bridge")
                self._uses_changed((new,))
                inherit_scopes(_ops_between(block, previous, old.op), old.op, None)
        consumers = self.consumers(old)
        anchor = old.op
        stated_apart = old.sym_type != new.sym_type
        renamed = stated_apart and symbols_renamed(old, new)
        if not replace_uses_in_block(block, old, new, consumers, self._accepted_inputs):
            # coremltools drops the uses one by one; the direct path empties the list at once.
            self._use_lists.prepare(old)
            block.replace_uses_of_var_after_op(
                anchor_op=anchor, old_var=old, new_var=new, no_check_var_types=True
            )
        if is_function_output:
            # coremltools gave `new` the output's name; the old var must not keep it too.
            old.name = old.name + "_replaced"
        if self.check_types:
            self._check_consumers(consumers)
        elif stated_apart:
            self._refresh_consumers(consumers, renamed)

    def _refresh_consumers(self, consumers: Sequence[Operation], renamed: bool) -> None:
        # The guard proved the consumers' outputs unchanged, but coremltools
        # still states the types it inferred from the old operand: a fresh
        # symbol (`is125`) where the new one has the query's `is0`, or a
        # select typed by a scalar branch now widened. Ops built later from
        # those types (an SDPA whose mask's length is is0 and key's is125)
        # would be refused, so the consumers take their types anew, as checked
        # mode has them do. An elementwise op that broadcast the old operand
        # to its output (a bypassed tile: 8 becomes 1 against the other
        # operand's 8) states its output rightly already, and re-typing it
        # would only mint a fresh symbol per fire: it is left, unless the
        # change is a renaming of symbols. One level: the consumers' own
        # consumers' stated types were consistent and stay so up to names.
        for op in consumers:
            if op.enclosing_block is None or (not renamed and op.op_type in mil_shapes.BINARY_BROADCASTING):
                continue
            try:
                with in_block(op.enclosing_block), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    op.type_value_inference(overwrite_output=True)
            except Exception:  # the stale type stays, as coremltools' own passes leave theirs
                pass

    def _check_consumers(self, consumers: Sequence[Operation]) -> None:
        # The rule's conditions are what prove that consumers compute the same
        # thing; this re-derives their output types to catch a rule whose
        # conditions do not. Symbol names may change; nothing else may.
        for op in consumers:
            if op.enclosing_block is None:
                continue
            before = [(self.dtype(v), self.shape(v)) for v in op.outputs]
            with in_block(op.enclosing_block):
                op.type_value_inference(overwrite_output=True)
            after = [(self.dtype(v), self.shape(v)) for v in op.outputs]
            for (old_dtype, old_shape), (new_dtype, new_shape), var in zip(before, after, op.outputs):
                if old_dtype != new_dtype or not mil_shapes.same_known_dims(old_shape, new_shape):
                    raise TypeChangedError(
                        f"op '{op.name}' output '{var.name}' changed from "
                        f"{mil_shapes.describe_type(old_dtype, old_shape)} to "
                        f"{mil_shapes.describe_type(new_dtype, new_shape)}"
                    )

    def replace_operand(self, op: Operation, old: Var, new: Var) -> None:
        self._changed = True
        changed = {}
        for name, value in op.inputs.items():
            if isinstance(value, (list, tuple)) and any(v is old for v in value):
                changed[name] = tuple(new if v is old else v for v in value)
            elif value is old:
                changed[name] = new
        if not changed:
            return
        self._uses_changed((old, new))
        self._use_lists.prepare(old)
        with in_block(op.enclosing_block):
            # The new operand differs in type on purpose (it is wider); the op's
            # own output must not change, which checked mode verifies.
            op.set_inputs(no_check_var_types=True, type_inference=False, **changed)
        if self.check_types:
            self._check_consumers([op])
        elif old.sym_type != new.sym_type:
            self._refresh_consumers([op], symbols_renamed(old, new))

    def remove_op(self, op: Operation) -> None:
        # Ops of its nested blocks go too, and may read an outer value of many uses.
        prepare = self._use_lists.prepare
        pending = [op]
        while pending:
            removed = pending.pop()
            operands = self.operands(removed)
            self._uses_changed(operands)
            for value in operands:
                if len(value._child_ops) >= MANY_USES:  # the one test most operands need
                    prepare(value, removed)
            for block in removed.blocks:
                pending.extend(block.operations)
        op.enclosing_block.remove_ops([op])

    def finish(self) -> None:
        """Put back what the run's bookkeeping changed: use lists, non-replaceable-var marks."""
        self._use_lists.restore()
        if self._changed and self._has_constexpr:
            for function in self.program.functions.values():
                function._propagate_nonreplaceable_vars()
        self._changed = False


# ---------------------------------------------------------------- scopes
#
# coremltools records where each op came from in `op.scopes`: the torch
# module (TORCHSCRIPT_MODULE_NAME/TYPE), the torch.export stack trace
# (EXIR_STACK_TRACE, EXIR_DEBUG_HANDLE), and the graph passes that made it
# (COREMLTOOLS_GRAPH_PASS). A torch conversion declares the frontend's
# sources essential and checks every op has them after each
# dead_code_elimination. coremltools' own passes give an op they create the
# scopes of the var it replaces (`Block._copy_scope_info`), but only through
# `replace_uses_of_var_after_op`, and only for ops made under a graph-pass
# scope alone; a rule also widens operands in place and runs outside any
# pass. So the adapter sets the scopes itself, the same way.


def _op_before(block: Block, op: Operation) -> Operation | None:
    """The op right before `op` in `block`, or None if `op` is first."""
    operations = block.operations
    if isinstance(operations, list):
        index = operations.index(op)
        return operations[index - 1] if index else None
    node = operations._get_node_from_op(op).prev
    return None if node is None else node.op


def _ops_between(block: Block, previous: Operation | None, op: Operation) -> list[Operation]:
    """The ops now between `previous` (None: the block's start) and `op`: those just inserted before `op`."""
    operations = block.operations
    if isinstance(operations, list):
        end = operations.index(op)
        start = 0 if previous is None else operations.index(previous) + 1
        return operations[start:end]
    inserted = []
    node = operations._get_node_from_op(op).prev
    while node is not None and node.op is not previous:
        inserted.append(node.op)
        node = node.prev
    return inserted


def _rule_of(name: str) -> str:
    # The engine names a new op "<rule>_<serial>" (before `_unique_name` may add
    # a suffix of its own, which `name` here does not have yet).
    rule, _, serial = name.rpartition("_")
    return rule if rule and serial.isdigit() else name


def inherit_scopes(ops: Sequence[Operation], source: Operation, rule: str | None) -> None:
    """Give `ops` the scopes of `source`, with the graph pass running (if any)
    and `rule` appended to its COREMLTOOLS_GRAPH_PASS history, as coremltools'
    `add_graph_pass_scope` records a pass."""
    from coremltools.converters.mil.mil.scope import (
        SCOPE_STACK,
        VALID_OPS_TO_COPY_SCOPE_INFO,
        ScopeSource,
        add_graph_pass_scope,
    )

    current = SCOPE_STACK.get_curr_scopes()
    history = list(current.get(ScopeSource.COREMLTOOLS_GRAPH_PASS, ()))
    if rule is not None:
        history.append(rule)
    for op in ops:
        scopes = add_graph_pass_scope(
            source.scopes, {ScopeSource.COREMLTOOLS_GRAPH_PASS: history} if history else {}
        )
        # A scope the caller opened around the run, that `source` has no entry of.
        for key, value in current.items():
            if key not in scopes and value:
                scopes[key] = list(value)
        op.scopes = scopes
        # Inside a pass coremltools would merge the replaced var's scopes into
        # these once more when a use is replaced (and assert on the result):
        # they are final already.
        if VALID_OPS_TO_COPY_SCOPE_INFO:
            VALID_OPS_TO_COPY_SCOPE_INFO[-1].discard(op)
