"""Shared fixtures: a home with the built-in corpus (helpers live in tl_helpers.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def built_corpus(tmp_path_factory) -> Path:
    from tinyllm.corpus import build_corpus
    from tinyllm.spec import CorpusSpec

    home = tmp_path_factory.mktemp("corpus-home")
    build_corpus(CorpusSpec(), home)
    return home / "corpora"


@pytest.fixture
def home(tmp_path, built_corpus) -> Path:
    """A fresh home folder holding corpora/default (copied, so tests never share run dirs)."""
    h = tmp_path / "home"
    h.mkdir()
    shutil.copytree(built_corpus, h / "corpora")
    return h
