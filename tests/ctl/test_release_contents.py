"""What a release holds (issue 40 item 12): what one serves -- the weights, the model config, the tokenizer
and the manifest with each file's sha256 and the gates -- and never the optimizer or resume state, which stay
with the run. The real ``ctl release`` of a real finished run; the released weights, loaded into a model
built from the released config alone, give the run's digest bit for bit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bi_helpers import copy_home, ctl

pytestmark = pytest.mark.slow


def test_a_release_holds_what_one_serves_and_no_optimizer(finished_home: Path, tmp_path: Path) -> None:
    import torch

    from tinyllm.digest import state_digest
    from tinyllm.model import GPT
    from tinyllm.spec import ModelConfig
    from tinyllm.tokenizer import from_identity

    home = copy_home(finished_home, tmp_path / "home")
    run = json.loads(ctl(home, "status", "train/mini", "--json").stdout)["result"]
    p = ctl(
        home,
        "release",
        "train/mini",
        "--suite",
        "ppl",
        "--eval-max-items",
        "2",
        "--select",
        "latest",
        "--gate",
        "ppl/ppl<=1e9",
        "--json",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)["result"]
    assert out["checkpoint"] == run["checkpoint"] == "runs/mini/ckpt/step-000006", out
    rel = home / out["path"]
    assert sorted(f.name for f in (rel / "model").iterdir()) == ["config.json", "model.pt", "tokenizer.json"]
    assert not list(rel.rglob("optimizer*")) and not list(rel.rglob("training_state*"))
    assert (home / run["checkpoint"] / "optimizer.pt").is_file()  # the optimizer stays with the run
    manifest = json.loads((rel / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["model/config.json", "model/model.pt", "model/tokenizer.json"]
    for name, entry in manifest["files"].items():
        data = (rel / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert manifest["gates"][0]["passed"] and manifest["checkpoint_digest"] == out["digest"]
    model = GPT(ModelConfig.model_validate_json((rel / "model/config.json").read_text()))
    model.load_state_dict(torch.load(rel / "model/model.pt", map_location="cpu", weights_only=True))
    assert state_digest(model.state_dict()) == run["digest"]
    tok = from_identity(json.loads((rel / "model/tokenizer.json").read_text()))
    assert tok.vocab_size == model.cfg.vocab_size  # the tokenizer the weights were trained with
