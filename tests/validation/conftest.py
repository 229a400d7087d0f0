import pytest


@pytest.fixture(scope="session")
def corpus_home(tmp_path_factory):
    """The built-in default corpus, built once (``tinyllm corpus``'s code, in process)."""
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    home = tmp_path_factory.mktemp("corpus-home")
    build_corpus(CorpusSpec(), home)
    return home


@pytest.fixture
def home(corpus_home, tmp_path):
    from val_helpers import make_home

    return make_home(corpus_home, tmp_path)
