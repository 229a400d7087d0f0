"""The validation block: seed defaults, and every invalid combination rejected at load with a clear line."""

import subprocess
import sys

import pytest

from tinyllm.spec import SpecError, parse_train_spec
from tinyllm.validation_config import DEFAULT_MAX_TOKENS, ValidationConfig

LM = {"enabled": True, "data": {"path": "builtin:heldout.txt"}}
GEN = {
    "enabled": True,
    "objective": "generation",
    "reward": ["exact_match", "contains"],
    "data": {"path": "builtin:prompts.jsonl", "prompt_column": "question", "response_column": "answer"},
}


def spec(validation):
    return parse_train_spec({"name": "v", "steps": 4, "validation": validation})


def test_seed_defaults():
    c = ValidationConfig()
    assert (c.enabled, c.before_training, c.every_steps, c.save_checkpoint) == (False, False, 20, False)
    assert c.checkpoint_components == ("model", "optimizer", "training_state")
    assert (c.batch_size, c.max_samples, c.seed, c.data) == (1, None, 0, None)
    s = c.sampling
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.n_generation, s.max_tokens) == (
        0.0,
        None,
        1,
        1.0,
        1,
        None,
    )
    r = s.resolved()
    assert r["top_p"] == 1.0 and r["max_tokens"] == DEFAULT_MAX_TOKENS and r["top_k"] == 1
    assert c.checkpoint.archive_dir is None


def test_valid_lm_and_generation_blocks_load():
    assert spec(LM).validation.objective == "lm"
    g = spec(GEN).validation
    assert g.reward == ["exact_match", "contains"] and g.data.prompt_column == "question"
    assert spec({**GEN, "reward": "exact_match"}).validation.reward == ["exact_match"]
    assert spec(
        {**GEN, "reward": ["nonempty"], "data": {"path": "p.jsonl", "prompt_column": "q"}}
    ).validation.reward == ["nonempty"]
    assert spec({**GEN, "sampling": {"top_k": None, "temperature": 0.7}}).validation.sampling.top_k is None


@pytest.mark.parametrize(
    "block, needle",
    [
        ({"enabled": True}, "requires an explicit held-out source"),
        ({**LM, "data": {"path": "h.txt", "shuffle": True}}, "shuffle must be false"),
        ({**LM, "checkpoint_components": []}, "must not be empty"),
        ({**LM, "checkpoint_components": ["model", "model"]}, "duplicate checkpoint component"),
        ({**LM, "checkpoint_components": ["model", "weights"]}, "unknown checkpoint component"),
        ({**LM, "reward": ["exact_match"]}, "generation' only"),
        ({**LM, "sampling": {"temperature": 1.0}}, "sampling applies"),
        ({**LM, "data": {"path": "h.txt", "prompt_column": "q"}}, "generation' only"),
        ({**GEN, "reward": []}, "no reward to inherit"),
        ({**GEN, "reward": ["bleu"]}, "unknown reward"),
        ({**GEN, "reward": ["contains", "contains"]}, "duplicate reward"),
        ({**GEN, "data": {"path": "p.jsonl", "response_column": "answer"}}, "requires validation.data.prompt_column"),
        ({**GEN, "data": {"path": "p.jsonl", "prompt_column": "q"}}, "require validation.data.response_column"),
        ({**LM, "every_steps": -1}, "every_steps"),
        ({**LM, "batch_size": 0}, "batch_size"),
        ({**LM, "max_samples": 0}, "max_samples"),
        ({**GEN, "sampling": {"n_generation": 0}}, "n_generation"),
        ({**GEN, "sampling": {"top_p": 0}}, "top_p"),
        ({**LM, "bogus": 1}, "bogus"),
    ],
)
def test_invalid_blocks_rejected_with_clear_message(block, needle):
    with pytest.raises(SpecError) as e:
        spec(block)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_components_checked_even_when_not_saving():
    """Empty/duplicate/unknown selections fail config validation whether or not they are used."""
    with pytest.raises(SpecError, match="unknown checkpoint component"):
        spec({**LM, "save_checkpoint": False, "checkpoint_components": ["adam"]})


def test_identity_excludes_schedule_but_includes_sampling():
    a = ValidationConfig(**GEN)
    assert a.identity() == ValidationConfig(**{**GEN, "every_steps": 3, "before_training": True}).identity()
    assert a.identity() != ValidationConfig(**{**GEN, "sampling": {"max_tokens": 5}}).identity()
    assert a.identity() != ValidationConfig(**{**GEN, "seed": 1}).identity()


@pytest.mark.slow
def test_spec_module_imports_without_torch():
    code = "import sys, tinyllm.spec, tinyllm.validation_config, tinyllm.validation.schedule, tinyllm.validation.planning; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_example_spec_loads():
    from pathlib import Path

    from tinyllm.spec import load_train_spec

    s = load_train_spec(Path(__file__).resolve().parents[2] / "specs" / "tiny-validation.json")
    v = s.validation
    assert v.enabled and v.objective == "lm" and v.data.path == "builtin:heldout.txt" and v.before_training
