"""rewrite: a rule-based graph-rewrite language and engine for ML model graphs.

    import rewrite
    rules = rewrite.load_rules("my.rules")   # or load_rules() for the shipped library
    stats = rules.apply(program)             # a coremltools MIL Program, in place
"""

from rewrite.api import RuleSet, load_rules, shipped_rules_path
from rewrite.engine.driver import RewriteLimitError, Statistics, UnsoundRewriteError
from rewrite.language.errors import Diagnostic, RuleError
from rewrite.predicates import register_predicate, unregister_predicate

__all__ = [
    "Diagnostic",
    "RewriteLimitError",
    "RuleError",
    "RuleSet",
    "Statistics",
    "load_rules",
    "register_predicate",
    "shipped_rules_path",
    "UnsoundRewriteError",
    "unregister_predicate",
]
