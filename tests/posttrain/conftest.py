import pytest


@pytest.fixture(scope="session")
def pt_home(tmp_path_factory):
    """The built-in corpus, a base (policy init) and a larger teacher checkpoint, the data files."""
    from pt_helpers import build_base_home

    return build_base_home(tmp_path_factory.mktemp("pt-base"))


@pytest.fixture
def home(pt_home, tmp_path):
    from pt_helpers import copy_home

    return copy_home(pt_home, tmp_path / "home")


@pytest.fixture(autouse=True)
def clear_stop_flag():
    from tinyllm.errors import STOP

    STOP["requested"] = False
    yield
    STOP["requested"] = False
