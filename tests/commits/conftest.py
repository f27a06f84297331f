"""The histories of these tests are a developer's checkout: their goldens are recorded at
the first commit, which the plugin refuses under a truthy ``CI`` (strict mode). ``CI`` is
what the machine running this suite sets, not part of the scenario: it is unset here, for
every module-scoped history too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def at_a_developers_desk() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CI", raising=False)
        yield
