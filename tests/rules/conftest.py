import pytest
from mil_cases import RULE

import rewrite


@pytest.fixture(scope="session")
def library():
    """The shipped rule library."""
    return rewrite.load_rules()


@pytest.fixture(scope="session")
def rules(library):
    """Only the rule under test, from the shipped library."""
    return library.only(RULE)
