"""What a rule may assume beyond IEEE-exact values, and what each grants.

A rule that is exact only under an assumption says so (`assume no_nans`), and
runs only where the user grants it (`rewrite apply --assume no-nans`,
`RuleSet.apply(..., assume={"no_nans"})`). The names follow LLVM's fast-math
flags, whose meaning they share; `verify` compares such a rule's instances
with the allowance its assumptions give (`rewrite.verify.checking`).
"""

from __future__ import annotations

from collections.abc import Iterable

# name -> what the rewrite may then change, as `--help` and the summary say it.
ASSUMPTIONS: dict[str, str] = {
    "no_nans": "where the original computes NaN, the result may be any value (LLVM's nnan)",
    "no_signed_zeros": "-0.0 and +0.0 may be taken for each other (LLVM's nsz)",
    "no_fully_masked_rows": "a softmax row whose every score is masked (-inf, or the lowest finite value) may "
                            "become zeros, as a fused attention makes it, where the original gives NaN or an average",
}


def flag(name: str) -> str:
    """The command-line spelling of an assumption: `no_nans` -> `no-nans`."""
    return name.replace("_", "-")


def granted(names: Iterable[str]) -> frozenset[str]:
    """Assumptions as a user names them (`no-nans` or `no_nans`), checked.

    Raises ValueError naming an unknown one and the known ones.
    """
    found = set()
    for name in names:
        canonical = name.strip().replace("-", "_")
        if canonical not in ASSUMPTIONS:
            known = ", ".join(flag(known) for known in ASSUMPTIONS)
            raise ValueError(f"unknown assumption '{name}' (the assumptions are {known})")
        found.add(canonical)
    return frozenset(found)
