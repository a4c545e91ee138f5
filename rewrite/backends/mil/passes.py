"""A rule set as a coremltools graph pass, for `ct.PassPipeline`."""

from __future__ import annotations

from rewrite.language.assumptions import granted


def register_graph_pass(rules, name: str, *, override: bool = True) -> str:
    """Register a `RuleSet` as a coremltools graph pass named `name`.

    `name` is "namespace::pass_name" (e.g. "common::remove_broadcast_tiles");
    the pass can then be inserted into a `ct.PassPipeline` like any other:

        register_graph_pass(rewrite.load_rules("tiles.rules"), "common::remove_broadcast_tiles")
        pipeline = ct.PassPipeline.DEFAULT
        pipeline.insert_pass(0, "common::remove_broadcast_tiles")

    The pass takes one option, `assume`: the assumptions to grant rules that
    state them, joined by commas (`pipeline.set_options(name, {"assume":
    "no_nans"})`); unknown names raise ValueError when the pass runs.
    """
    from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
    from coremltools.converters.mil.mil.passes.pass_registry import register_pass

    namespace, separator, pass_name = name.partition("::")
    if not separator or not namespace or not pass_name.isidentifier():
        raise ValueError(f"pass name {name!r} must look like 'namespace::pass_name'")

    class RuleSetPass(AbstractGraphPass):
        __doc__ = f"The rules {', '.join(r.name for r in rules.rules)} as a graph pass."
        rule_set = rules
        last_statistics = None
        assume = ""  # a pass option (coremltools sets it from the pipeline's options): names joined by commas

        def apply(self, program):
            from rewrite.backends.mil.validation import InvalidProgramError, problem

            names = self.assume.split(",") if isinstance(self.assume, str) else self.assume
            statistics = type(self).last_statistics = self.rule_set.apply(
                program, assume=granted(name for name in names if name.strip()))
            if statistics.fires:
                # coremltools' later passes and its backend would fail on a
                # malformed program with words of their own: say whose it is.
                found = problem(program)
                if found is not None:
                    fired = ", ".join(n for n, rule in statistics.rules.items() if rule.fires)
                    raise InvalidProgramError(found, None, None, f"the graph pass '{name}', in which fired {fired}")

    RuleSetPass.__name__ = pass_name
    RuleSetPass.__qualname__ = pass_name
    register_pass(namespace=namespace, override=override)(RuleSetPass)
    return name


