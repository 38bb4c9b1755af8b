"""Each cycle's adapter loads with PeftModel.from_pretrained and carries a model card with
the run's figures (issue 58)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_a_cycle_adapter_loads_with_peft_and_has_a_card(tmp_path, tiny_build):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from coevolve.outputs.model_card import write_model_cards

    adapter = tmp_path / "run" / "adapters" / "cycle-1"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_build))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    get_peft_model(model, lora).save_pretrained(str(adapter))
    (adapter / "training.json").write_text(
        json.dumps(
            {
                "result": {"algorithm": "sft", "device": "cpu", "world_size": 1},
                "config": {"lora": {"r": 4, "alpha": 8}, "learning_rate": 0.01},
            }
        )
    )
    rows = [
        {"cycle": 0, "heldout_success": 0.25, "train_steps": None},
        {
            "cycle": 1,
            "heldout_success": 0.5,
            "heldout_episodes": 18,
            "rollout_success": 0.4,
            "rollout_episodes": 12,
            "accepted": 3,
            "pool_size": 60,
            "train_steps": 2,
            "train_examples": 10,
            "train_loss": 1.5,
        },
    ]
    [card] = write_model_cards(tmp_path / "run", rows)
    text = card.read_text()
    assert text.startswith("---\nlibrary_name: peft\n") and "- sft" in text
    assert "base_model:" not in text  # a local path is no Hub id
    assert "| held-out success after this cycle | 50.0% |" in text
    assert "| held-out success of the starting agent (cycle 0) | 25.0% |" in text
    assert "| LoRA rank / alpha | 4 / 8 |" in text and "| training steps | 2 |" in text
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(tiny_build)), str(adapter)
    )
    assert loaded.peft_config["default"].r == 4


def test_the_card_names_a_hub_base_only():
    from coevolve.outputs.model_card import _hub_id

    assert _hub_id("Qwen/Qwen2.5-7B-Instruct")
    assert not _hub_id("/models/Qwen2.5-7B-Instruct") and not _hub_id("./mine")
